"""The course as a book: generate its pages, then run mkdocs on them.

    python docs/book.py                       # only write the pages into build/book
    python docs/book.py serve                 # pixi run docs: write them, then `mkdocs serve`
    python docs/book.py build --strict        # pixi run docs-build: write them, then `mkdocs build --strict`

Nothing here is a second copy of the text: each step's page is made from the module
docstring of solutions/solution_NN.py (the text steps/step_NN.py carries too), the
front page from README.md, the other pages from docs/*.md and the demo's model card,
with their links rewritten for the book's layout. The pages go to build/book (ignored
by git; mkdocs.yml reads them from there), the site to build/site.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # checker/ draws the steps' pictures
sys.path.insert(0, str(ROOT / "docs"))  # typeset.py, also when mkdocs loads this file as its hook
BOOK = ROOT / "build" / "book"

import typeset  # noqa: E402  (docs/, beside this file)

from checker import registry  # noqa: E402  (the path above first)

STEPS = [step.number for step in registry.STEPS]

def code(text: str) -> str:
    """reST's ``literal`` as Markdown's `literal`."""
    return re.sub(r"``(.+?)``", r"`\1`", text)


def pytorch_link(match: re.Match) -> str:
    """docs/pytorch-to-max.md#masking-with--inf as a link named by its heading, "Masking with -inf"."""
    from pymdownx.slugs import slugify  # mkdocs.yml's slugs: GitHub's

    slug = slugify(case="lower")
    page = (ROOT / "docs" / "pytorch-to-max.md").read_text()
    titles = {slug(h, "-"): h for h in re.findall(r"^#+ (.*)$", page, flags=re.M)}
    anchor = match[1] or ""
    return f"[{titles.get(anchor[1:], 'MAX for PyTorch users')}](../pytorch-to-max.md{anchor})"


def step_page(step: str) -> str:
    """Markdown for one step, from the docstring of its solution."""
    source = (ROOT / "solutions" / f"solution_{step}.py").read_text()
    lines = ast.get_docstring(ast.parse(source)).splitlines()
    title, body = lines[0].rstrip("."), lines[1:]
    out = [f"# {code(title)}", ""]
    fence = math = False
    for i, line in enumerate(body):
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if line and not line.startswith(" ") and nxt.startswith("    "):
            out += (["```", ""] if fence else []) + [f"## {line}", ""]
            fence, math = False, line.startswith("The math")
            continue
        text = line[4:] if line.startswith("    ") else line
        # The section's formulas, typeset (docs/typeset.py); not a diagram's header, as step 02's.
        caption = nxt.startswith(" " * (len(line) - len(line.lstrip()) + 4)) and not typeset.is_formula_line(nxt)
        if math and typeset.is_formula_line(text) and not caption:
            out += (["```", ""] if fence else []) + [typeset.typeset(code(text)), ""]
            fence = False
            continue
        table = text.startswith("|")  # a Markdown table: its cells are padded, and it stays a table
        deeper = not table and (text.startswith("    ") or bool(re.search(r"\S  +\S|-->", text)))  # a diagram, math
        if deeper and not fence:
            out.append("```text")
            fence = True
        elif fence and text and not deeper:
            while out[-1] == "":
                out.pop()
            out += ["```", ""]
            fence = False
        if fence:
            out.append(text[4:] if text.startswith("    ") else text)
        else:
            text = re.sub(r"docs/pytorch-to-max\.md(#[\w-]+)?", pytorch_link, code(text))
            out.append(text)
    if fence:
        out.append("```")
    out += ["", "## What it computes", "", picture_line(step)]
    out += [
        "",
        "## Your turn",
        "",
        f"Fill in the TODOs of `steps/step_{step}.py`, look at what it does with "
        f"`pixi run show {step}`, then check it with `pixi run s{step}`.",
        "",
    ]
    return "\n".join(out)


def picture_line(step: str) -> str:
    """The step's picture (drawn by write_pages beside the page), or one line saying it has none."""
    from checker.pictures import PICTURES

    if step not in PICTURES:
        return f"This step has no matrix to draw: `pixi run show {step}` prints its values."
    name = PICTURES[step][1]
    return (f"![The solution's {name}](step-{step}.png)\n\n"
            f"The solution's {name}, as `pixi run show {step} --png FILE` draws it beside yours.")


def draw_pictures(folder: Path) -> None:
    """step-NN.png for every step with a matrix: the solution's, from the numpy oracle
    (milliseconds; running the solution on MAX would compile kernels on a fresh machine)."""
    from checker.pictures import PICTURES
    from checker.show import draw

    for step, (matrix, name) in PICTURES.items():
        draw({f"solution: {name}": matrix()}, folder / f"step-{step}.png")


def relinked(text: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


def write_pages(book: Path = BOOK) -> None:
    if book.exists():
        shutil.rmtree(book)
    (book / "steps").mkdir(parents=True)
    for step in STEPS:
        (book / "steps" / f"step-{step}.md").write_text(step_page(step))
    draw_pictures(book / "steps")
    (book / "typeset.css").write_text(typeset.CSS)
    readme = (ROOT / "README.md").read_text()
    (book / "index.md").write_text(
        relinked(readme, [(r"\]\(docs/", "]("), (r"\]\(weights/demo/MODEL_CARD\.md", "](model-card.md")])
    )
    for page in [*sorted((ROOT / "docs").glob("*.md")), *decision_records()]:
        up = "../" * len(page.relative_to(ROOT / "docs").parts)  # from the page to the repository's root
        at = re.escape(up)
        text = relinked(page.read_text(), [
            (rf"\]\({at}README\.md", "](" + up[3:] + "index.md"),
            (rf"\]\({at}weights/demo/MODEL_CARD\.md", "](" + up[3:] + "model-card.md"),
            # A link to a source file (../model/cpu.py) has no page in the book: its path as code.
            (rf"\[([^\]]+)\]\({at}([^)#\s]+)(#[^)\s]*)?\)", r"\1 (`\2`)"),
        ])
        (book / page.relative_to(ROOT / "docs")).parent.mkdir(parents=True, exist_ok=True)
        (book / page.relative_to(ROOT / "docs")).write_text(text)
    card = (ROOT / "weights" / "demo" / "MODEL_CARD.md").read_text()
    (book / "model-card.md").write_text(relinked(card, [(r"\]\(\.\./\.\./docs/", "](")]))


def decision_records() -> list[Path]:
    """docs/decisions/NNNN-title.md, in their order."""
    return sorted((ROOT / "docs" / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md"))


def on_config(config, **kwargs):
    """mkdocs hook (mkdocs.yml's ``hooks``): the course's section of the navigation gets one
    entry per step of checker/registry.py, before the section's other pages; the decisions'
    section one per record of docs/decisions/, after its index."""
    for section in config["nav"] or []:
        if isinstance(section, dict) and "The course" in section:
            pages = section["The course"]
            steps = [{step.heading: f"steps/step-{step.number}.md"} for step in registry.STEPS]
            section["The course"] = steps + [page for page in pages if page not in steps]
        if isinstance(section, dict) and "Decisions" in section:
            records = [f"decisions/{page.name}" for page in decision_records()]
            section["Decisions"] = [page for page in section["Decisions"] if page not in records] + records
    return config


def main(argv: list[str]) -> int:
    write_pages()
    if not argv:
        print(f"book pages written to {BOOK.relative_to(ROOT)}")
        return 0
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    return subprocess.run([sys.executable, "-m", "mkdocs", *argv], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
