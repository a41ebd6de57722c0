"""`--push_to_hub`: one upload when the run ends, and what a failed one says.

The Trainer creates the Hub repo as it starts (`Trainer.init_hf_repo`), uploads the output folder from every
`save_model` call and from checkpoints (`--hub_strategy`), through `huggingface_hub` (`HF_ENDPOINT`, `HF_TOKEN`). Here:
- `save_model` never uploads (`VitTrainer.save_model`): the one final upload is `push_trained_model`'s, after the
  metrics, the model card and the reports are written, so the Hub gets the folder the user gets;
- a token the Hub rejects when the repo is created stops the run before training (one `error:` line, exit 2:
  nothing was trained, nothing is lost); an endpoint that cannot be reached then is a warning, and the upload is
  tried again at the end;
- a failed final upload (endpoint unreachable, token rejected) ends the run with one `error:` line (exit 1) after the
  local save is complete, saying where the model is and how to upload it by hand.
"""

import os

from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError

from hf_vit_scaling.errors import TrainingStopped, UserInputError


def network_errors() -> tuple[type[BaseException], ...]:
    """What a call to the Hub raises when the Hub says no or cannot be reached: HTTP status errors (`HfHubHTTPError`,
    an `OSError`), socket errors, and the HTTP client's transport errors (huggingface_hub 2.x uses httpx2)."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(__import__(module).HTTPError)
        except ImportError:
            pass
    return tuple(errors)


def rejected(err: BaseException) -> bool:
    """The Hub answered 401 or 403: the token is missing, wrong, or may not write to the repo."""
    response = getattr(err, "response", None)
    return isinstance(err, HfHubHTTPError) and response is not None and response.status_code in (401, 403)


def why(err: BaseException) -> str:
    """One line: the Hub's answer or the connection error, without a token."""
    text = " ".join(str(err).split()) or err.__class__.__name__
    return text[:300]


def where(repo: str | None) -> str:
    return f"{constants.ENDPOINT}/{repo}" if repo else constants.ENDPOINT


def refuse_rejected_token(err: BaseException, repo: str | None) -> UserInputError:
    return UserInputError(
        f"--push_to_hub: the Hub at {constants.ENDPOINT} rejected the token when creating {repo or 'the repo'} "
        f"({why(err)}); nothing was trained. Fix: log in with `hf auth login` (or set HF_TOKEN, or pass --hub_token) "
        "with a token that may write to that repo, or drop --push_to_hub."
    )


def upload_failed(err: BaseException, repo: str | None, output_dir: str) -> TrainingStopped:
    if rejected(err):
        fix = "log in with `hf auth login` (or set HF_TOKEN) with a token that may write to that repo"
    else:
        fix = f"check that {constants.ENDPOINT} can be reached (HF_ENDPOINT, a proxy, the network)"
    stop = TrainingStopped(
        f"--push_to_hub: the upload to {where(repo)} failed ({why(err)}). Training finished and everything is saved "
        f"in {os.path.abspath(output_dir)}; nothing was lost. Fix: {fix}, then upload that folder with "
        f"`hf upload {repo or '<user>/<repo>'} {output_dir}`."
    )
    stop.every_rank_knows = False  # only the main process uploads
    return stop


def push_trained_model(trainer) -> None:
    """The final upload (every rank calls it; the Trainer uploads from the main process)."""
    try:
        trainer.push_to_hub()
    except network_errors() as err:
        raise upload_failed(err, trainer.hub_model_id or trainer.args.hub_model_id, trainer.args.output_dir) from err
