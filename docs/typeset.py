"""The steps' formulas typeset for the book, from the plain text their docstrings hold.

A learner reads ``scores = Q K^T / sqrt(d)`` in the editor; the book shows it typeset.
There is one copy of each formula, the docstring's: ``latex`` reads that notation
(Python's, with ``^`` for a power and ``sqrt(...)``) and writes LaTeX, which
latex2mathml turns into MathML at build time. Browsers draw MathML themselves: the
pages fetch nothing to show it.

A line of a step's "The math" section is a formula line when one of its parts (parts
are separated by two or more spaces) holds ``=``, ``<=>`` or ``~`` and does not read as
a sentence; the other parts are labels before it and remarks after it, kept as text.
"""

from __future__ import annotations

import html
import re

# Names written upright as operators; everything else longer than one letter is a
# variable's name (upright too, so that `mean` is not read as m e a n).
FUNCTIONS = {"sqrt", "softmax", "tanh", "exp", "argmax", "sum", "concat", "norm", "sublayer", "cos", "sin",
             "rope", "rotate_half", "gelu_new", "LayerNorm", "MultiHead", "max", "attn", "mlp", "ln_1", "ln_2",
             "lm_head", "wte", "wpe", "block"}
GREEK = {"pi": r"\pi", "theta": r"\theta"}
SYMBOLS = {"<=>": r"\iff", "<=": r"\le", ">=": r"\ge", "==": "=", "**": "^", "*": r"\cdot ", "~": r"\sim ",
           "..": r"\ldots ", "@": r"\,@\,", ";": r";\quad ", "{": r"\{", "}": r"\}", "%": r"\%", "&": r"\&"}
# The book's stylesheet for them (mkdocs.yml's extra_css): MathML at the size of the text
# around it (browsers draw it a little smaller), a formula line a little apart from the next.
CSS = "p.math-line { margin: 0.4em 0; }\np.math-line math { font-size: 1.2em; }\n"
TOKEN = re.compile(r"\s*(<=>|<=|>=|==|\*\*|\.\.|\d+(?:\.\d+)?(?:e-?\d+)?|[A-Za-z_][A-Za-z_0-9]*|\S)")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def name(word: str) -> str:
    """One identifier as LaTeX: Q, d_h as d with subscript h, mean upright, pi as a letter."""
    if word in GREEK:
        return GREEK[word]
    if word == "inf":
        return r"\infty"
    if word == "T":
        return "T"
    escaped = word.replace("_", r"\_")
    if word in FUNCTIONS:
        return rf"\operatorname{{{escaped}}}"
    sub = re.fullmatch(r"([A-Za-z]+)_([A-Za-z0-9]{1,2})", word)
    if sub:  # Q_i, d_h, c_0, head_i
        return f"{name(sub[1])}_{{{sub[2]}}}"
    return word if len(word) == 1 else rf"\mathrm{{{escaped}}}"


def wide(word: str) -> bool:
    """A name written as a word (``weights``), not a letter (``V``, ``Q_i``)."""
    return len(re.sub(r"_[A-Za-z0-9]{1,2}$", "", word)) > 1


def group(toks: list[str], i: int) -> tuple[list[str], int]:
    """The operand starting at toks[i]: a bracketed group (without its brackets
    when they are round) or one token; and the index after it."""
    if toks[i] not in "([":
        if toks[i] == "-" and i + 1 < len(toks):  # x ** (-2i / d) and x^-1
            inner, j = group(toks, i + 1)
            return ["-", *inner], j
        return [toks[i]], i + 1
    close = {"(": ")", "[": "]"}[toks[i]]
    depth, j = 0, i
    while j < len(toks):
        depth += toks[j] == toks[i]
        depth -= toks[j] == close
        j += 1
        if depth == 0:
            break
    inner = toks[i + 1:j - 1]
    return (inner if toks[i] == "(" else toks[i:j]), j


def convert(toks: list[str]) -> str:
    out, i = [], 0
    while i < len(toks):
        tok = toks[i]
        if tok == "sqrt" and i + 1 < len(toks) and toks[i + 1] == "(":
            inner, i = group(toks, i + 1)
            out.append(rf"\sqrt{{{convert(inner)}}}")
            continue
        if tok in ("^", "**") and i + 1 < len(toks):
            inner, i = group(toks, i + 1)
            out.append(r"^{\top}" if inner == ["T"] else f"^{{{convert(inner)}}}")
            continue
        if tok in SYMBOLS:
            out.append(SYMBOLS[tok])
        elif re.match(r"[A-Za-z_]", tok):
            if i and re.match(r"[A-Za-z_]", toks[i - 1]) and (wide(tok) or wide(toks[i - 1])):
                out.append(r"\,")  # weights V: a product of two names, not one name
            out.append(name(tok))
        else:
            out.append(tok)
        i += 1
    return re.sub(r"(?<=[A-Za-z}])\s+(?=[A-Za-z\\])", " ", " ".join(out))


def latex(formula: str) -> str:
    """A docstring's formula as LaTeX: ``Q K^T / sqrt(d)`` -> ``Q K^{\\top} / \\sqrt{d}``."""
    return convert(tokens(formula))


def mathml(formula: str) -> str:
    from latex2mathml.converter import convert as to_mathml

    return to_mathml(latex(formula), display="inline")


def is_formula(part: str) -> bool:
    """A part of a line that is an equation, an equivalence or a draw (``next ~ p``), not prose."""
    if not re.search(r"=|<|>|\s~\s", part) or part.endswith(":") or part.startswith("for "):
        return False  # a label ("greedy (temperature == 0):") or a remark ("for i < d/2")
    prose = re.search(r"`|\b(the|is|are|keeps|and|when|get)\b|([A-Za-z]+ ){4}", part)  # words, not symbols
    return not part.rstrip().endswith(".") and not prose


def parts(line: str) -> list[str]:
    """A line's parts: the runs between two or more spaces, after alignment
    spaces before an ``=`` are closed up (``scores  = ...``)."""
    out = []
    for part in re.split(r"\s{2,}", re.sub(r"\s{2,}(=|~)\s", r" \1 ", line.strip())):
        label = re.fullmatch(r"([^=]*?:)\s+(.*=.*)", part)  # "sampling (temperature > 0): p = ..."
        out += [label[1], label[2]] if label else [part] if part else []
    return out


def is_formula_line(line: str) -> bool:
    return any(is_formula(p) for p in parts(line))


def typeset(line: str) -> str:
    """One formula line as HTML: each formula part in MathML, the labels and remarks as text."""
    cells = []
    for part in parts(line):
        if is_formula(part):
            cells.append(mathml(part))
        else:
            cells.append(f'<span class="math-note">{html.escape(part)}</span>')
    return '<p class="math-line">' + " &emsp; ".join(cells) + "</p>"
