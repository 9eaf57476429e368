"""``--impl steps`` says whose code it runs: a learner's step that imports the
solutions (a solution copied to move on) or that fails its check is named in
one line before anything is built, and the banner names the reference's steps
beside the learner's; the checker keeps each verdict for the app to read."""

from __future__ import annotations

import subprocess
import sys

from checkpoints import STEP_07_EDITS, learner_tree

from checker.skeleton import ROOT
from model.course import Whose, last_check, record_check, reference_steps, spans, steps_needed, whose
from model.graph_source import compile_estimate
from model.options import BuildOptions


def _copied_and_broken(tmp_path):
    """A finished learner's tree whose step 09 is the solution copied as it is
    (importing solutions/) and whose step 07 has no c_proj."""
    cwd, env = learner_tree(tmp_path, finished=True)
    steps = cwd / "steps"
    (steps / "step_09.py").write_text((ROOT / "solutions" / "solution_09.py").read_text())
    old, new = STEP_07_EDITS["forward-without-c_proj"]
    (steps / "step_07.py").write_text((steps / "step_07.py").read_text().replace(old, new))
    return cwd, env


def _run(cwd, env, *args):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_app_names_a_copied_step_and_a_failing_one_before_building(tmp_path):
    cwd, env = _copied_and_broken(tmp_path)
    checked = _run(cwd, env, "-m", "checker", "07", "--file", "steps/step_07.py", "--no-color")
    assert checked.returncode == 1, checked.stdout
    # A model folder that does not exist: the run ends after the line, before anything is built.
    done = _run(cwd, env, "-m", "model", "--impl", "steps", "--model", str(tmp_path / "none"), "x")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("error: "), done.stderr
    said = lines[0]
    assert said.startswith("note: --impl steps runs your steps 01-03, 05-07, 09-11 and the reference's 01-04, 07, 08")
    assert "your step 09 imports solutions/" in said and "step 07 fails its check" in said, said
    served = _run(cwd, env, "-m", "serve", "--impl", "steps", "--model", "demo", "--dry-run")
    assert served.returncode == 0, served.stderr
    assert "serve: --impl steps runs your steps 01-03, 05-07, 09-11 and the reference's" in served.stderr
    assert "step 07 fails its check" in served.stderr
    assert "serve: built from your steps 01-03, 05-07, 09-11 and the reference's 01-04, 07, 08\n" in served.stderr
    # The engine's processes inherit that the steps' notes are said: they do not repeat them.
    (cwd / "steps" / "__init__.py").write_text((ROOT / "steps" / "__init__.py").read_text())  # the project's own
    inherited = _run(cwd, env, "-c",
                     "import os, sys; from serve.__main__ import main; "
                     "main(['--impl', 'steps', '--model', 'demo', '--dry-run']); "
                     "print(os.environ.get('GPT2_MAX_STEPS_IMPORTS_NAMED'))")
    assert inherited.stdout.splitlines()[-1] == "1" and "note: steps/" not in inherited.stderr, inherited.stderr


def test_the_app_says_a_copied_step_once_not_once_per_import(tmp_path):
    # The steps package names every import of solutions.* when it is imported (the checker's
    # detail); the app has said it in one line and imports the package without them.
    cwd, env = _copied_and_broken(tmp_path)
    (cwd / "steps" / "__init__.py").write_text((ROOT / "steps" / "__init__.py").read_text())  # the project's own
    plain = _run(cwd, env, "-c", "import steps")
    assert "imports solutions.solution_08" in plain.stderr
    quiet = _run(cwd, env, "-c", "from model.course import import_steps_quietly; import_steps_quietly(); "
                                 "import steps.step_09")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_whose_code_follows_the_imports_into_the_solutions(tmp_path):
    cwd, _ = _copied_and_broken(tmp_path)
    folder = cwd / "steps"
    # Step 09 is the solution's text: it runs the reference's 03, 04, 07, 08 (and what they import).
    assert reference_steps("11", folder=folder) == (["09"], ["01", "02", "03", "04", "07", "08"])
    assert steps_needed("11", folder=folder) == ["01", "02", "03", "05", "06", "07", "09", "10", "11"]
    assert spans(["01", "02", "03", "05", "07", "08", "10", "11", "12"]) == "01-03, 05, 07, 08, 10-12"


def test_a_verdict_is_kept_for_the_files_as_they_are(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "steps"
    folder.mkdir()
    (folder / "step_01.py").write_text("x = 1\n")
    (folder / "step_02.py").write_text("from steps.step_01 import x\n")
    assert last_check("02", folder) is None
    record_check("02", folder, False)
    assert last_check("02", folder) is False
    record_check("02", folder, True)
    assert last_check("02", folder) is True
    (folder / "step_01.py").write_text("x = 2\n")  # a step it imports changed: not checked so
    assert last_check("02", folder) is None and whose("02", folder=folder).unchecked == ["01", "02"]


def test_the_banner_names_the_reference_s_steps_and_what_of_step_07_runs():
    own = Whose(["01", "02", "07", "11"], [], [], [], [])
    assert own.built("app").startswith("built from your steps 01, 02, 07, 11; of step 07 your forward, _attn")
    assert "flash attention in place of your ConcatCache and _attn" in own.built("server")
    assert own.warning() is None
    copied = Whose(["01", "02", "07", "11"], ["11"], ["01", "07", "10", "11"], [], [])
    assert copied.built("app") == "built from your steps 01, 02, 07, 11 and the reference's 01, 07, 10, 11"
    assert "your step 11 imports solutions/" in copied.warning()


def test_the_compile_notice_for_the_learner_s_steps_promises_no_seconds():
    assert "seconds" not in compile_estimate(BuildOptions(impl="steps", device="cpu"))
    assert "new after each edit of a step" in compile_estimate(BuildOptions(impl="steps", device="cpu"))
    assert "seconds when MAX's caches are warm" in compile_estimate(BuildOptions(device="cpu"))
