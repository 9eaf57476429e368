"""`pixi run show NN`: run a step on its small input beside the solution.

For every step 01-16: the solution shows a match (exit 0), the skeleton
names its TODO (exit 1), and a seeded mistake (the same edits test_mistakes
uses) shows a difference (exit 1)."""

from __future__ import annotations

import pytest
from conftest import mutate, skeleton_file, solution_path
from test_mistakes import MISTAKES

from checker import show

# One seeded mistake per step whose effect the step's fixed input shows.
SHOWN_MISTAKES = {
    "01": "context of 512", "02": "mask hides the diagonal", "03": "bias forgotten", "04": "ReLU",
    "05": "ids shifted by one", "06": "positions start at 1", "07": "no causal mask", "08": "post-LN",
    "09": "no attention residual", "10": "no final layer norm", "11": "head with a bias",
    "12": "greedy picks the lowest", "13": "numpy: no scale", "14": "post-LN without residual",
    "15": "weights are the raw scores", "16": "rope on queries only",
}
EDITS = {(step, name): edits for step, name, edits, _ in MISTAKES}
STEPS = sorted(show.SHOWS)


def run(capsys, *argv) -> tuple[int, str]:
    code = show.main(list(argv))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("step", STEPS)
def test_solution_matches(step, capsys):
    code, out = run(capsys, step, "--file", str(solution_path(step)))
    assert code == 0, out
    assert "matches the solution" in out and "output: yours shape" in out


@pytest.mark.parametrize("step", STEPS)
def test_skeleton_names_its_todo(step, tmp_path, capsys):
    code, out = run(capsys, step, "--file", str(skeleton_file(step, tmp_path)))
    assert code == 1, out
    # Its own TODO, with the solution's output; or, where it runs earlier
    # steps of the repository's steps/ (skeletons too), those, before anything runs.
    assert ("TODO" in out and "the solution gives" in out) or f"Step {step} runs your steps 0" in out


@pytest.mark.parametrize("step", STEPS)
def test_seeded_mistake_differs(step, tmp_path, capsys):
    path = mutate(step, tmp_path, EDITS[(step, SHOWN_MISTAKES[step])])
    code, out = run(capsys, step, "--file", str(path))
    assert code == 1, out
    assert "DIFFERS" in out or "your code raised" in out


def test_picture_and_png(tmp_path, capsys):
    png = tmp_path / "mask.png"
    code, out = run(capsys, "02", "--file", str(solution_path("02")), "--png", str(png))
    assert code == 0
    assert "  -inf" in out and png.stat().st_size > 1000


def test_unknown_step_is_a_usage_error(capsys):
    assert show.main(["17"]) == 2


def test_the_solution_s_rows_are_printed_beside_yours(tmp_path, capsys):
    # show once printed only the learner's matrix; a mask compared with
    # >= instead of > is plain when the solution's rows stand beside it.
    path = tmp_path / "step_02.py"
    path.write_text(solution_path("02").read_text().replace("hidden = F.greater(", "hidden = F.greater_equal("))
    code, out = run(capsys, "02", "--file", str(path))
    assert code == 1
    # The name is the solution's matrix's: the learner's code may have returned another one.
    header, first_row = out.split("the solution's mask (0 visible, -inf hidden), beside yours from the same "
                                  "input:\n")[1].splitlines()[:2]
    assert header.split() == ["yours", "|", "solution"]
    yours, solution = first_row.split("|")
    assert yours.split() == ["0.00", "0.00", "-inf", "-inf", "-inf", "-inf"]
    assert solution.split() == ["0.00", "0.00", "0.00", "-inf", "-inf", "-inf"]


def test_an_unfinished_earlier_step_is_named_before_anything_compiles(capsys, monkeypatch):
    # The first `show 07` once took 233 s (the solution's kernels) before
    # failing on an unfinished step 01. The repository's steps/ are skeletons.
    import checker.show as shown

    monkeypatch.setattr(shown, "SHOWS", {**shown.SHOWS, "07": lambda module: pytest.fail("nothing may run")})
    code, out = run(capsys, "07")
    assert code == 1
    assert "Step 07 runs your steps 01, 02; still TODO: steps/step_01.py (line" in out and "steps/step_02.py" in out


@pytest.mark.parametrize("mistake, expected", [
    ("update does not keep the result", "DIFFERS, largest difference"),
    ("cache concatenated on axis 1", "your code raised in the call for the token at position 5"),
])
def test_a_cache_fault_shows_in_the_calls_after_the_prompt(mistake, expected, tmp_path, capsys):
    # show 07 once ran one call with an empty cache: an update that keeps
    # nothing, or concatenates on the wrong axis, "matched the solution".
    on_axis_1 = [(f"F.concat([self.{n}, {n[0]}], axis=2)", f"F.concat([self.{n}, {n[0]}], axis=1)")
                 for n in ("keys", "values")]
    edits = EDITS.get(("07", mistake)) or on_axis_1
    code, out = run(capsys, "07", "--file", str(mutate("07", tmp_path, edits)))
    assert code == 1, out
    assert "then 3 tokens one at a time, each call through the same cache" in out
    assert expected in out
    if "DIFFERS" in expected:
        assert "the prompt: matches" in out and "the token at position 5, 5 cached: DIFFERS" in out
