"""scripts/lab.py, the runner and tables every experiment script shares: a finished run is kept, an
unfinished one starts again, a failed one stops the experiment with one line naming its log."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import lab  # noqa: E402

# A stand-in for a training script: counts its starts in argv[2], leaves final/ when argv[3] is ok
SCRIPT = ("import os, sys; open(sys.argv[2], 'a').write('x'); "
          "os.makedirs(os.path.join(sys.argv[1], 'final')) if sys.argv[3] == 'ok' else sys.exit(3)")


def run(tmp_path, outcome="ok"):
    out, starts = tmp_path / "run", tmp_path / "starts"
    cmd = [sys.executable, "-c", SCRIPT, str(out), str(starts), outcome]
    usage = lab.run_script("arm-s0", cmd, str(out), str(tmp_path))
    return usage, starts.read_text().count("x")


def test_a_finished_run_is_kept_and_not_run_again(tmp_path):
    usage, starts = run(tmp_path)
    assert starts == 1 and usage["wall_s"] > 0 and (tmp_path / "run" / "usage.json").exists()
    again, starts = run(tmp_path)
    assert starts == 1 and again == usage


def test_an_unfinished_run_starts_again_from_an_empty_folder(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stale.pt").write_text("half a checkpoint")
    _, starts = run(tmp_path)
    assert starts == 1 and not (tmp_path / "run" / "stale.pt").exists()


def test_a_failed_run_stops_with_one_line_naming_its_log(tmp_path):
    with pytest.raises(SystemExit) as stop:
        run(tmp_path, outcome="fail")
    assert "arm-s0 failed (exit 3)" in str(stop.value) and str(stop.value).endswith("arm-s0.log")
    assert not (tmp_path / "run" / "usage.json").exists()  # the next invocation runs it again


def test_cells_and_tables():
    assert lab.mean_sd([0.25, 0.5], scale=100) == "37.5 ± 17.7"
    assert lab.mean_sd([0.3]) == "0.3" and lab.mean_sd([1.0, float("nan")]) == "-"
    assert lab.md_table(["a", "b"], [["1", "2"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |"]
    assert lab.side_by_side(lambda x, y: x * y, [(2, 3), (4, 5)], 2) == [6, 20]


def test_a_generated_doc_gets_its_notes_and_keeps_the_time_to_accuracy_block(tmp_path):
    doc = tmp_path / "RESULTS.md"
    start, end = lab.TIME_BLOCK
    doc.write_text(f"old\n\n{start}\nminutes\n{end}\n")
    (tmp_path / "RESULTS-notes.md").write_text("## Notes\n\nby hand.\n\n")
    text = lab.write_doc(str(doc), "# New\n\n| a |")
    assert text == doc.read_text()
    assert text == f"# New\n\n| a |\n\n## Notes\n\nby hand.\n\n{start}\nminutes\n{end}\n"


def test_every_command_runs_once_and_a_finished_one_is_kept(tmp_path):
    starts = tmp_path / "starts"
    commands = {str(tmp_path / name): [sys.executable, "-c", SCRIPT, str(tmp_path / name),
                                       str(starts), "ok"] for name in ("a-s0", "b-s0")}
    usage = lab.run_commands(commands, 2, str(tmp_path))
    assert list(usage) == list(commands) and starts.read_text() == "xx"
    assert lab.run_commands(commands, 2, str(tmp_path)) == usage and starts.read_text() == "xx"
