"""What the Hugging Face Hub says about one repository, read by structure: a repository its
owner withdrew (../hub_withdrawn.toml: the Hub refuses it in the words of a typo or a private
repository, so only a listed id is named), an upload whose commits exceed the Hub's hourly
quota (a 429 on /api/<type>/<org>/<name>/commit/<revision>, not a download's 429), and a
huggingface-cli subcommand the installed huggingface_hub does not have (`download` came in
0.17; 1.0 left only a stub that says to use `hf`), and pyannote's refusal of a gated model.
"""

from __future__ import annotations

import re
from functools import cache

from dsenv.data import load_table
from dsenv.doctor.explain.families import Reading, reading

FAMILY = "huggingface"

_REPO_ID = r"[\w.-]+/[\w.-]+"
# The id the Hub refused: transformers'/diffusers' sentence (after a resolve error), and
# huggingface_hub's RepositoryNotFoundError with its URL (the Hub or a mirror: HF_ENDPOINT)
_REFUSED = (
    re.compile(rf"(?P<repo>{_REPO_ID}?)/?'? is not a local folder and is not a valid model "
               r"identifier"),
    re.compile(rf"Repository Not Found for url: https?://[^/\s]+/(?:api/(?:models|datasets|"
               rf"spaces)/)?(?P<repo>{_REPO_ID}?)(?=[/.\s]|$)"),
    re.compile(rf"(?:401|404) Client Error[^\n]*? for url: https?://[^/\s]+/(?:api/models/)?"
               rf"(?P<repo>{_REPO_ID}?)/(?:resolve|revision|tree)/"),
)
# An upload's commit (huggingface_hub's create_commit: upload_file/folder, push_to_hub);
# huggingface.py reads every other 429 as the download limit
COMMIT_URL = re.compile(rf"\b429\b[^\n]*?\n?[^\n]*?https?://[^/\s]+/api/(?:models|datasets|"
                        rf"spaces)/(?P<repo>{_REPO_ID}?)/commit/")
_COMMIT_QUOTA = re.compile(r"exceeded (?:our hourly quotas for action: commit|the rate limit for "
                           r"repository commits(?: \((?P<limit>\d+) per hour\))?)")
# argparse's refusal of a subcommand (the choices it lists are the installed release's)
_CLI_CHOICE = re.compile(r"huggingface-cli: error: (?:argument \{[^}\n]*\}: )?invalid choice: "
                         r"'(?P<command>download|upload)'")
_CLI_GONE = re.compile(r"`?huggingface-cli`? is deprecated and no longer works")
# pyannote's own words for a repository the Hub refused (it then returns None): a gated model
# whose conditions the token's account has not accepted, or no token
_PYANNOTE_REFUSED = re.compile(r"Could not download '(?P<repo>[^']+)' (?P<kind>pipeline|model)\.\s*"
                               r"It might be because the (?P=kind) is private or gated")


@cache
def withdrawn() -> dict[str, dict]:
    """{repository id: its row of hub_withdrawn.toml}."""
    rows = load_table("dsenv.doctor.explain", "hub_withdrawn.toml")["withdrawn"]
    return {repo: row for row in rows for repo in row["repos"]}


def read(message: str) -> list[Reading]:
    if not message:
        return []
    found: list[Reading] = []
    gone = withdrawn()
    for shape in _REFUSED:
        for m in shape.finditer(message):
            if row := gone.get(m["repo"]):
                found.append(reading(FAMILY, "hf.repo-withdrawn", m[0], repo=m["repo"],
                                     withdrawn=row["withdrawn"], use_instead=row["instead"]))
                return found
    if m := _PYANNOTE_REFUSED.search(message):
        found.append(reading(FAMILY, "hf.gated-repo-auth", m[0], repo=m["repo"],
                             refused=f"pyannote {m['kind']} (private or gated)"))
    commit, quota = COMMIT_URL.search(message), _COMMIT_QUOTA.search(message)
    if commit or quota:
        found.append(reading(FAMILY, "hf.commit-rate-limited", (commit or quota)[0][:200],
                             repo=commit["repo"] if commit else "",
                             refused="commit (an upload), 429",
                             limit=f"{quota['limit']} commits per hour"
                             if quota and quota["limit"] else ""))
    if m := _CLI_CHOICE.search(message):
        found.append(reading(FAMILY, "hf.hub-version-api-removed", m[0],
                             command=f"huggingface-cli {m['command']}",
                             installed="huggingface_hub < 0.17 (no download/upload commands)"))
    elif m := _CLI_GONE.search(message):
        found.append(reading(FAMILY, "hf.hub-version-api-removed", m[0],
                             command="huggingface-cli",
                             installed="huggingface_hub >= 1.0 (the CLI is `hf`)"))
    return found
