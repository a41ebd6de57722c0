"""`--push_to_hub` through the real `huggingface_hub` client against a local stand-in for the Hub
(`tests/helpers/fake_hub.py`, `HF_ENDPOINT` on the loopback): what one upload holds, file by file; that no token is in
any uploaded file; and the failures: an unreachable endpoint and a token rejected at the upload end with one
`error:` line after the local save is complete (exit 1), a token rejected when the run starts stops it before
training (exit 2)."""

import pytest

from tests.helpers.fake_hub import FakeHub
from tests.helpers.launchers import error_lines, read_json, run_recipe, side_by_side

TOKEN = "hf_pushTestToken0123456789"
REPO = "someone/vit-tiny-digits"
PUSH = ["--max_steps", "3", "--push_to_hub", "true", "--hub_model_id", REPO, "--hub_token", TOKEN]
SAVED = ("model.safetensors", "config.json", "preprocessor_config.json", "README.md", "all_results.json")


def push_run(tmp_path, name: str, **hub_options):
    """(hub, completed process, output_dir); `endpoint="closed"`: a loopback port nothing listens on."""
    closed = hub_options.pop("closed", False)
    hub = FakeHub(**hub_options)
    endpoint = "http://127.0.0.1:9" if closed else hub.endpoint
    out = tmp_path / name
    try:
        proc = run_recipe(out, *PUSH, check=False, HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", HF_TOKEN="")
    finally:
        hub.close()
    return hub, proc, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("push")
    cases = {"ok": {}, "unreachable": {"closed": True}, "rejected_at_upload": {"reject_commits": True},
             "rejected_at_start": {"reject_token": True}}  # fmt: skip
    done = side_by_side(*[lambda n=n, o=o: push_run(tmp, n, **o) for n, o in cases.items()])
    return dict(zip(cases, done))


def test_one_upload_holds_the_model_its_card_and_results_and_no_token(runs):
    hub, proc, out = runs["ok"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hub.repos == [REPO]
    (commit,) = hub.commits  # saves during the run upload nothing: one commit, when the folder is complete
    assert commit["repo"] == REPO
    for name in SAVED:
        assert commit["files"][name] == (out / name).read_bytes(), name
    assert not any(name.startswith("checkpoint-") for name in commit["files"])
    card = commit["files"]["README.md"].decode()
    accuracy = read_json(out / "all_results.json")["eval_accuracy"]
    assert f"| eval_accuracy | {accuracy:.4f} |" in card and "## Training speed" in card and "images/s" in card
    leaked = [name for name, data in commit["files"].items() if TOKEN.encode() in data]
    assert leaked == []
    assert f"Bearer {TOKEN}" in hub.authorizations  # the upload used the token given


@pytest.mark.parametrize("case, words", [("unreachable", "Connection refused"), ("rejected_at_upload", "403")])
def test_a_failed_upload_ends_with_one_error_line_after_the_local_save(runs, case, words):
    _, proc, out = runs[case]
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = error_lines(proc.stderr)
    assert "--push_to_hub: the upload to" in line and REPO in line and words in line, line
    assert f"everything is saved in {out}" in line and f"hf upload {REPO} {out}" in line, line
    assert TOKEN not in proc.stderr + proc.stdout
    for name in SAVED:
        assert (out / name).is_file(), name
    assert "Done:" not in proc.stdout


def test_a_token_rejected_when_the_run_starts_stops_it_before_training(runs):
    hub, proc, out = runs["rejected_at_start"]
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = error_lines(proc.stderr)
    assert "rejected the token when creating" in line and "nothing was trained" in line and "Fix:" in line, line
    assert hub.commits == [] and not (out / "model.safetensors").exists()
    assert TOKEN not in proc.stderr + proc.stdout
