"""The documentation holds together: the book builds strict with a page per step (and
its picture where the step has a matrix), the README's commands run as written, every
relative link in README.md and docs/*.md resolves (anchors included, as GitHub makes
them), and the README stays a page a newcomer reads in ten minutes."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from checker.pictures import PICTURES

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import book  # noqa: E402  (docs/book.py)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "decisions").glob("*.md")),
         ROOT / "weights" / "demo" / "MODEL_CARD.md"]


def outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def github_anchor(heading: str) -> str:
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.*)$", outside_code(page.read_text()), flags=re.M)}


def relative_links(page: Path) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", outside_code(page.read_text()))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
            continue
        if anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading makes #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


# A checker's report quoted in the docs: "step_NN.py:LINE in FUNC: `CODE`".
QUOTED_FRAME = re.compile(r"(step_\d\d)\.py:(\d+) in (\w+): `([^`]+)`")


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_quoted_reports_point_at_the_skeletons_lines():
    """A report the docs quote names the line of steps/step_NN.py it came from: the skeleton's
    TODO itself, or, for a learner's code, the TODO line that code replaces. A skeleton edited
    since moves its lines, and the quoted report would point at another one."""
    quoted = [(page, m) for page in PAGES for m in QUOTED_FRAME.finditer(page.read_text())]
    assert quoted, "no quoted report found: the pattern no longer matches the docs"
    wrong = []
    for page, m in quoted:
        name, line, function, code = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        source = (ROOT / "steps" / f"{name}.py").read_text()
        defined = functions(ast.parse(source)).get(function)
        text = source.splitlines()[line - 1].strip() if line <= len(source.splitlines()) else ""
        todo = text.startswith("raise NotImplementedError") and "TODO" in text
        if defined is None or not defined.lineno <= line <= defined.end_lineno:
            wrong.append(f"{page.name}: {name}.py:{line} is not in {function}")
        elif not (text == code or (todo and not code.startswith("raise NotImplementedError"))):
            wrong.append(f"{page.name}: {name}.py:{line} reads {text!r}, not {code!r} or a TODO line")
    assert not wrong, "; ".join(wrong)


def test_readme_is_short():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    long = [line[:60] for line in outside_code(text).splitlines() if len(line) > 200 and not line.startswith("|")]
    assert not long, f"README lines over 200 characters outside code and tables: {long}"


def test_book_builds_strict_with_a_page_per_step(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "book.py"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ),  # see conftest.run_python
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for step in book.STEPS:
        page = site / "steps" / f"step-{step}" / "index.html"
        assert page.exists(), f"no page for step {step}"
        html = page.read_text()
        images = re.findall(r'<img [^>]*src="([^"]+)"', html)
        if step in PICTURES:
            assert images == [f"../step-{step}.png"], f"step {step}'s page shows {images}, not its picture"
            png = (page.parent / images[0]).resolve()
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
        else:
            assert not images and "This step has no matrix to draw" in html, f"step {step}: {images}"
    assert "Step 02: the causal mask" in (site / "steps" / "step-02" / "index.html").read_text()
    # A docstring's table is a table on its page (it once became two code blocks and a stray row).
    table = re.search(r"<table>.*?</table>", (site / "steps" / "step-01" / "index.html").read_text(), re.S)
    assert table and "gpt2-medium" in table[0] and table[0].count("<tr>") == 5
    # The math is typeset: MathML on the page, the formula no longer a code block.
    attention = (site / "steps" / "step-07" / "index.html").read_text()
    assert "<msqrt>" in attention and "<math" in attention and "Q K^T / sqrt(d)" not in attention


def test_every_formula_of_the_math_sections_is_typeset():
    import typeset

    for step in book.STEPS:
        for section in re.split(r"^## ", book.step_page(step), flags=re.M):
            if not section.startswith("The math"):
                continue
            for block in re.findall(r"```text\n(.*?)```", section, re.S):
                lines = block.splitlines()
                left = [line for line in lines[1 if step == "02" else 0:] if typeset.is_formula_line(line)]
                assert not left, f"step {step}: {left} left as code"  # (step 02's diagram keeps its header)
            assert "<math" in section or step == "01", f"step {step}: nothing typeset in {section[:40]!r}"  # prose


@pytest.mark.parametrize("formula, latex", [
    ("scores = Q K^T / sqrt(d)", r"\mathrm{scores} = Q K ^{\top} / \sqrt{d}"),
    ("y = (x - mean) / sqrt(var + eps) * weight + bias",
     r"y = ( x - \mathrm{mean} ) / \sqrt{\mathrm{var} + \mathrm{eps}} \cdot \mathrm{weight} + \mathrm{bias}"),
    ("inv_freq[i] = theta ** (-2i / d)", r"\mathrm{inv\_freq} [ i ] = \theta ^{- 2 i / d}"),
    ("next ~ p", r"\mathrm{next} \sim p"),
    ("head_i = softmax(Q_i K_i^T / sqrt(d_h)) V_i",
     r"\mathrm{head}_{i} = \operatorname{softmax} ( Q_{i} K_{i} ^{\top} / \sqrt{d_{h}} ) V_{i}"),
    ("out = weights V", r"\mathrm{out} = \mathrm{weights} \, V"),
])
def test_a_docstring_formula_as_latex(formula, latex):
    import typeset

    assert typeset.latex(formula) == latex
    assert typeset.mathml(formula).startswith("<math")


def test_prose_and_labels_stay_text():
    import typeset

    assert not typeset.is_formula_line("eps = 1e-5 keeps the division finite when a vector is constant.")
    assert typeset.parts("greedy (temperature == 0):  next = argmax(logits)") == [
        "greedy (temperature == 0):", "next = argmax(logits)"]
    assert [typeset.is_formula(p) for p in typeset.parts("inv_freq[i] = theta ** (-2i / d)      for i < d/2")] == [
        True, False]


def test_the_books_pictures_are_what_show_draws():
    """checker/pictures.py (numpy) gives every step whose `pixi run show` has a matrix, and the
    same matrix as the solution run on MAX (seconds with a warm kernel cache)."""
    import importlib

    from checker import maxrun, show

    for step in book.STEPS:
        with maxrun.interpreter():
            shown = show.SHOWS[step](importlib.import_module(f"solutions.solution_{step}"))
        assert (shown.picture is not None) == (step in PICTURES), f"step {step}: show and the book disagree"
        if shown.picture is not None:
            matrix, name = PICTURES[step]
            np.testing.assert_allclose(matrix(), shown.picture, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")


def test_step_pages_come_from_the_solutions_docstrings():
    for step in book.STEPS:
        page = book.step_page(step)
        assert page.startswith(f"# Step {step}") or page.startswith(f"# Bonus step {int(step)}"), page[:60]
        assert f"pixi run s{step}" in page


# --- The README's shell commands run as written -------------------------------------------

PYTHONS = ("python", "python3", "python3.13")


def readme_commands(text: str) -> list[list[str]]:
    """Each command of the README's ```sh / ```bash blocks as argv (comments and `\\`
    line continuations handled the way a shell would, by shlex)."""
    commands, language, pending = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            language = None if language is not None else line[3:].strip()
            continue
        if language not in ("sh", "bash"):
            continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if argv := shlex.split(pending, comments=True):
            commands.append(argv)
        pending = ""
    return commands


def pixi_tasks() -> dict[str, str]:
    with open(ROOT / "pixi.toml", "rb") as f:
        table = tomllib.load(f)["tasks"]
    return {name: spec if isinstance(spec, str) else spec["cmd"] for name, spec in table.items()}


def in_repo(module: str) -> bool:
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def module_help(module: str) -> subprocess.CompletedProcess:
    """`python -m module --help` run here (each takes under 3 s: argparse before any MAX work)."""
    return subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def command_problem(argv: list[str], tasks: dict[str, str]) -> str | None:
    """Why a README command would not run as written, or None when it would."""
    if argv[0] == "curl" or argv[:2] == ["git", "clone"]:
        return None
    if argv[:2] == ["pixi", "run"] or (argv[0] in PYTHONS and argv[1:2] == ["tasks.py"]):
        task, args = argv[2], argv[3:]
        if task not in tasks:
            return f"no task {task!r} in pixi.toml's [tasks]"
        module = re.fullmatch(r"python -m ([\w.]+)", tasks[task])
        if module is None or not in_repo(module[1]):  # `max ...`, pytest: not this repository's to check
            return None
        argv = ["python", "-m", module[1], *args]  # the task runs our module: check its options too
    if argv[0] in PYTHONS and argv[1:2] == ["-m"]:
        module, options = argv[2], [a.split("=")[0] for a in argv[3:] if a.startswith("--")]
        if not in_repo(module):
            return f"no module {module} in this repository"
        done = module_help(module)
        if done.returncode != 0:
            return f"`python -m {module} --help` exits {done.returncode}: {done.stderr[-300:]}"
        unknown = [o for o in options if not re.search(rf"{re.escape(o)}\b", done.stdout)]
        return f"`python -m {module} --help` lists no {', '.join(unknown)}" if unknown else None
    return "neither a pixi task, `python3.13 tasks.py TASK`, `python -m MODULE`, curl nor git clone"


def test_readme_commands_run_as_written():
    commands = readme_commands((ROOT / "README.md").read_text())
    assert ["pixi", "run", "s01"] in commands and any(c[0] == "curl" for c in commands), commands
    tasks = pixi_tasks()
    problems = [f"{shlex.join(c)}: {p}" for c in commands if (p := command_problem(c, tasks))]
    assert not problems, "README commands that would not run:\n" + "\n".join(problems)


@pytest.mark.parametrize("command, problem", [
    ("pixi run s99", "no task 's99'"),
    ("python3.13 tasks.py docs-serve", "no task 'docs-serve'"),
    ("python -m checker.nothing --help", "no module checker.nothing"),
    ("pixi run generate --model demo --temprature 0", "lists no --temprature"),
    ("make test", "neither"),
])
def test_a_wrong_readme_command_is_named(command, problem):
    assert problem in command_problem(shlex.split(command), pixi_tasks())


def test_readme_commands_parse_like_a_shell():
    text = "```sh\npixi run s01   # check it\ncurl -s x \\\n  -d '{\"a\": 1}'\n```\n```\n$ not shell\n```\n"
    assert readme_commands(text) == [["pixi", "run", "s01"], ["curl", "-s", "x", "-d", '{"a": 1}']]
