"""Words several causes share (doctor/explain/alternatives.toml, issue 23): where threads
settled the same error text as different causes, `dsenv explain` lists the causes and what
tells them apart instead of naming one.

The table is checked against real texts (tests/fixtures/explain_shared/rows.jsonl: for each
group, a verbatim text with the shared words from a thread that settled each member): every
member has one, from its own thread, and explain answers each with the group; a member's
telling evidence names that member alone (the healthy twin: the answer is one cause again);
a text whose parts a family parser compares keeps its ranked cause; a text without the
shared words is no group's (the probe finds nothing)."""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

import pytest

from dsenv.doctor import catalogue
from dsenv.doctor.explain import alternatives
from tests.harness.cli import dsenv, explain
from tests.harness.explaining import answer

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = [json.loads(line) for line in
        (FIXTURES / "explain_shared" / "rows.jsonl").read_text().splitlines() if line.strip()]
SYMPTOMS = [json.loads(line) for path in sorted((FIXTURES / "explain_symptoms").glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def test_the_table_names_catalogue_modes_and_compiles():
    assert alternatives.groups()
    for g in alternatives.groups():
        assert len(g.modes) >= 2 and len(set(g.modes)) == len(g.modes), g.id
        assert all(catalogue.mode(m) is not None and catalogue.mode(m).id == m for m in g.modes)
        assert set(g.tells) <= set(g.modes), g.id
        for p in (*g.words, *(p for ps in g.tells.values() for p in ps)):
            re.compile(p)
        assert g.which and all(s.startswith("https://") for s in g.sources), g.id
        # "@family.name" and "@also" were resolved to the patterns they name
        assert not any(p.startswith("@") for p in (*g.words, *(p for ps in g.tells.values()
                                                               for p in ps))), g.id
    ids = [g.id for g in alternatives.groups()]
    assert len(ids) == len(set(ids))


def test_every_member_has_a_settled_thread_with_the_shared_words():
    """Each member's row holds the words and none of any member's telling evidence; the
    group's sources are exactly its rows' threads, one thread per row."""
    by_group = collections.defaultdict(lambda: collections.defaultdict(set))
    for row in ROWS:
        g = alternatives.group(row["group"])
        assert g is not None and row["mode"] in g.modes, row["url"]
        assert g.says(row["text"]) and not g.told(row["text"]), row["url"]
        by_group[g.id][row["mode"]].add(row["url"])
    for g in alternatives.groups():
        missing = [m for m in g.modes if not by_group[g.id][m]]
        assert not missing, f"{g.id}: no settled thread with the shared words for {missing}"
        urls = [u for urls in by_group[g.id].values() for u in urls]
        assert len(urls) == len(set(urls)), f"{g.id}: one thread settled two causes?"
        assert set(g.sources) == set(urls), g.id


def test_rows_come_from_threads_the_measured_sets_do_not_hold():
    held = {json.loads(line)["url"] for name in ("explain_corpus", "explain_holdout")
            for line in (FIXTURES / name / "messages.jsonl").read_text().splitlines()
            if line.strip()}
    assert not {r["url"] for r in ROWS} & held


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['group']}:{r['mode']}@{r['url'][19:]}")
def test_explain_answers_a_shared_text_with_its_group(row):
    group, causes = answer(row["text"])
    g = alternatives.group(row["group"])
    if g.usual:  # the usual member named alone, the group shown with it (the next test)
        assert not group and causes[0] == g.usual, causes
        return
    assert group == g.id and set(g.modes) <= set(causes), causes
    assert row["mode"] in causes


def test_telling_evidence_names_its_member_alone():
    """Each telling pattern is grounded in that member's own symptoms (a real text that holds
    it); the group's shared text with that symptom chained above it (transformers raises its
    OSError from the request's exception) is answered with the member alone."""
    symptoms = collections.defaultdict(list)
    for s in SYMPTOMS:
        symptoms[s["mode"]].append(s["text"])
    told = 0
    for g in alternatives.groups():
        shared = next(r["text"] for r in ROWS if r["group"] == g.id)
        for member, patterns in g.tells.items():
            for p in patterns:
                texts = [t for t in symptoms[member] if re.search(p, t, alternatives.FLAGS)]
                assert texts, f"{g.id}: no symptom of {member} holds {p!r}"
                for text in texts:
                    group, causes = answer(f"{text}\n\nThe above exception was the direct cause "
                                           f"of the following exception:\n\n{shared}")
                    assert not group and causes[0] == member, (member, causes)
                    told += 1
    assert told


def test_a_text_whose_parts_the_parsers_compare_keeps_its_cause():
    """``decided``: torch's "The current PyTorch install supports CUDA capabilities sm_37 ..."
    lets the gpu family compare the GPU's arch with the build's list; a text with it keeps the
    ranked cause (grounded in a member's own symptom, read above the group's shared text)."""
    checked = 0
    for g in alternatives.groups():
        if not g.decided:
            continue
        shared = next(r["text"] for r in ROWS if r["group"] == g.id)
        for s in SYMPTOMS:
            if s["mode"] in g.modes and any(re.search(p, s["text"], alternatives.FLAGS)
                                            for p in g.decided):
                group, causes = answer(f"{s['text']}\n{shared}")
                assert not group and causes[0] == s["mode"], (s["url"], causes)
                checked += 1
    assert checked


def test_a_member_the_line_holds_evidence_against_is_left_out(monkeypatch):
    """A group applies only to the causes the line could be: a member whose own evidence
    against (the catalogue's `against`) is in the line is not listed at the best's score.
    bitsandbytes' "Could not load bitsandbytes native library" is evidence against a missing
    CUDA runtime (loader.cuda-lib-missing); a group of the two over libcudart's words leaves
    the runtime out of that line and lists it for the bare loader line (the twin)."""
    group = alternatives.Group(
        "test-bnb", "a CUDA runtime library was not found",
        (r"libcudart\.so\.[0-9.]+: cannot open shared object file",),
        ("loader.bitsandbytes-cuda-binary", "loader.cuda-lib-missing"), {}, (), "-", ())
    monkeypatch.setattr(alternatives, "groups", lambda: (group,))
    bnb = ("Could not load bitsandbytes native library: libcudart.so.11.0: cannot open shared "
           "object file: No such file or directory")
    _, causes = answer(bnb)
    assert causes[0] == "loader.bitsandbytes-cuda-binary"
    assert "loader.cuda-lib-missing" not in causes and not answer(bnb)[0], causes
    # the twin: without that evidence the words are the group's, both causes listed
    bare = ("OSError: libcudart.so.11.0: cannot open shared object file: No such file or "
            "directory\n  File \"bitsandbytes/cextension.py\", line 22")
    group_id, causes = answer(bare)
    assert group_id == "test-bnb" and "loader.cuda-lib-missing" in causes, causes


def test_a_text_without_the_shared_words_is_no_groups():
    # the member's own specific words (a 503 from the Hub) name it; a code error names nothing
    group, causes = answer("requests.exceptions.HTTPError: 503 Server Error: Service "
                           "Unavailable for url: https://huggingface.co/api/models/gpt2")
    assert not group and causes[:1] == ["hf.hub-transient-outage"]
    assert answer("ValueError: too many values to unpack (expected 2)") == ("", [])
    # datasets' "Couldn't reach" for a host that is not Hugging Face's (a university server that
    # came back, huggingface/datasets#3238) is not the Hub's words
    assert answer("ConnectionError: Couldn't reach https://kdd.ics.uci.edu/databases/"
                  "reuters21578/reuters21578.tar.gz") == ("", [])


@pytest.mark.parametrize("text, group_id", [
    ("RuntimeError: CUDA error: CUDA_ERROR_INSUFFICIENT_DRIVER", "driver-older-than-runtime"),
    ("THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 error=35",
     "driver-older-than-runtime"),
    ("numba.cuda.cudadrv.driver.CudaAPIError: [209] Call to cuModuleLoadData results in "
     "CUDA_ERROR_NO_BINARY_FOR_GPU", "cuda-no-kernel-image"),
    ("RuntimeError: CUDA error: invalid device function", "cuda-no-kernel-image"),
])
def test_a_cuda_error_in_any_of_its_forms_is_its_groups(text, group_id):
    """One CUDA error has several forms (the runtime's text, the enum of either API, the number
    in a wrapper's frame; families/cuda_errors.py reads them into one kind): the causes its threads
    settled for one form are the causes of every form."""
    group, causes = answer(text)
    assert group == group_id and len(causes) >= 2, (text, group, causes)


def test_a_cuda_error_of_another_kind_or_hips_words_is_not_the_group():
    assert answer("RuntimeError: HIP error: invalid device function")[0] != "cuda-no-kernel-image"
    group, causes = answer("RuntimeError: CUDA error: uncorrectable ECC error encountered")
    assert not group and causes[:1] == ["gpu.ecc-uncorrectable"]


def test_a_shared_soname_in_another_loaders_words_is_the_same_group():
    """TensorFlow's and JAX's DSO loader print the failed dlopen as "Could not load dynamic
    library 'libX.so.N'" (the dlerror after it, when shown, holds the group's first words):
    the same soname missing, the same causes; another library is not this group's."""
    for text in ("Could not load dynamic library 'libcusolver.so.11'",
                 "W tensorflow/stream_executor/platform/default/dso_loader.cc:64] Could not "
                 "load dynamic library 'libcudart.so.11.0'; dlerror: libcudart.so.11.0: cannot "
                 "open shared object file: No such file or directory"):
        group, causes = answer(text)
        assert group == "cuda-runtime-soname-missing" and len(causes) >= 3, (text, causes)
    group, _ = answer("Could not load dynamic library 'libnvinfer.so.7'")
    assert group != "cuda-runtime-soname-missing"


@pytest.mark.parametrize("row", [r for r in ROWS if alternatives.group(r["group"]).usual],
                         ids=lambda r: f"{r['group']}:{r['mode']}@{r['url'][19:]}")
def test_a_usual_cause_is_named_with_what_else_its_words_were(row):
    """A group whose words threads settled mostly as one cause (``usual``: a port another
    process holds, for EADDRINUSE) names that cause and shows the other members with what tells
    them apart; each member's own row holds the words, so each answer shows the group."""
    g = alternatives.group(row["group"])
    done = dsenv("explain", row["text"])
    assert done.returncode == 0, explain(done)
    head = " ".join(done.stdout.split())
    assert head.startswith(f"{g.usual}: ") and "known causes share" not in head, head
    others = [m for m in g.modes if m != g.usual]
    assert f"also {', '.join(others)} had these words too ({g.id};" in head, head
    data = json.loads(dsenv("explain", "--json", row["text"]).stdout)
    assert "shared" not in data and data["matches"][0]["id"] == g.usual
    assert g.which in data["matches"][0]["also"]
    # the thread cited is another member's (the table lists the usual cause's threads first)
    cited = next(r for r in ROWS if r["url"] == g.sources[-1])
    assert cited["group"] == g.id and cited["mode"] != g.usual


def test_a_members_tell_beside_other_words_names_nothing():
    """set_device(rank) in a traceback tells the global-rank bug apart only where CUDA said
    invalid device ordinal; beside CUDA's initialization error (a fork after CUDA started,
    pytorch/pytorch#17357) it names neither member."""
    frames = ('  File "train.py", line 40, in main\n    torch.cuda.set_device(rank)\n'
              'RuntimeError: cuda runtime error (3) : initialization error')
    assert answer(frames) == ("", [])
    _, causes = answer(frames.replace("cuda runtime error (3) : initialization error",
                                      "CUDA error: invalid device ordinal"))
    assert causes[:1] == ["job.device-index-from-global-rank"]


def test_a_cause_of_other_words_shows_no_usual_group():
    """The twin: a port refused for privilege (EACCES, below 1024) is no group's usual cause."""
    done = dsenv("explain", "RuntimeError: The server socket has failed to bind to [::]:80 "
                            "(errno: 13 - Permission denied).")
    assert "had these words too" not in done.stdout and '"also"' not in dsenv(
        "explain", "--json", "RuntimeError: CUDA error: out of memory").stdout


HUB_UNREACHABLE = ("OSError: We couldn't connect to 'https://huggingface.co' to load this file, "
                   "couldn't find it in the cached files and it looks like gpt2 is not the path "
                   "to a directory containing a file named config.json.")


def test_the_answer_says_what_tells_the_causes_apart():
    done = dsenv("explain", HUB_UNREACHABLE)
    assert done.returncode == 0, explain(done)
    g = alternatives.group("hub-unreachable")
    head = done.stdout.split("\n\n", 1)[0]
    assert head.startswith(f"{len(g.modes)} known causes share these words (hub-unreachable)")
    assert "the text alone cannot tell which" in head and "which" in head
    assert all(m in head for m in g.modes) and all(s in head for s in g.sources)
    for i, m in enumerate(g.modes, 1):
        assert f"[{i} of {len(g.modes)}] {m}: " in done.stdout
    data = json.loads(dsenv("explain", "--json", HUB_UNREACHABLE).stdout)
    assert data["shared"]["id"] == "hub-unreachable"
    assert data["shared"]["modes"] == [m["id"] for m in data["matches"]] == list(g.modes)


CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, the connect is refused
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")  # conftest's


@pytest.mark.parametrize("case, env, shows", [
    # a job's node that reaches nothing: the node without internet
    ("no internet", {"HF_ENDPOINT": CLOSED}, "cache.hf-online-on-offline-node"),
    # the job's environment sends the Hub through a proxy that does not answer
    ("proxy down", {"HF_ENDPOINT": "https://192.0.2.1", "HTTPS_PROXY": CLOSED,
                    "https_proxy": CLOSED}, "hf.proxy-required"),
    # the healthy twin: offline mode set, the loaders never reach out
    ("offline set", {"HF_ENDPOINT": CLOSED, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "TRANSFORMERS_OFFLINE": "1"}, None),
])
def test_here_says_which_cause_this_node_shows(tmp_path, case, env, shows):
    """--here runs each member's check in this job (a Slurm allocation, as the environment
    says): cache.offline tells a node without internet from a proxy that does not answer."""
    env = {"SLURM_JOB_ID": "7", "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "",
           "no_proxy": "", **env}
    done = dsenv("explain", "--here", "--env", sys.executable, HUB_UNREACHABLE, env=env,
                 drop=OFFLINE)
    assert done.returncode == 0, explain(done)
    head = " ".join(done.stdout.split("\n\n", 1)[0].split())  # ids are never broken
    if shows:
        assert f"here of these causes, this node shows {shows}" in head, head
    else:
        # the outage has no check (what the Hub did then is not decided on this node now),
        # nor has the gate (the token's access is the Hub's to say)
        assert ("here none that a check here decides is present (not found here: "
                "cache.hf-online-on-offline-node, hf.proxy-required; not decided here: "
                "hf.hub-transient-outage, hf.gated-repo-auth)") in head, head


def test_here_without_a_check_that_decides_says_so(tmp_path):
    """A login node (no allocation): the check only reports facts, so nothing is decided
    there and the answer sends the user to the node that failed."""
    done = dsenv("explain", "--here", "--env", sys.executable, HUB_UNREACHABLE,
                 env={"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": CLOSED},
                 drop=("SLURM_JOB_ID", *OFFLINE))
    head = " ".join(done.stdout.split("\n\n", 1)[0].split())
    # nothing was decided here: it must not say that none of the causes is present
    assert "no check on this node decides between them (not decided here: " in head and \
        "none of them is present" not in head and "on the node and in the " \
        "environment that failed" in head, head


@pytest.mark.parametrize("text", [
    "HSA_STATUS_ERROR_INVALID_ISA: The instruction set architecture is invalid.",
    "RuntimeError: HIP error: no kernel image is available for execution on the device",
])
def test_a_group_of_a_family_parsers_words_takes_each_of_its_wordings(text):
    """hip-no-code-object's words are the rocm family's own pattern ("@rocm.no-code-object"),
    not a copy: a wording none of the group's rows prints is the group's too; the iGPU and the
    card named around it (rocm.igpu-selected's own `also`, "@also") name that member alone."""
    group, causes = answer(text)
    assert group == "hip-no-code-object" and causes[:2] == ["gpu.rocm-gfx-unsupported",
                                                            "rocm.igpu-selected"], causes
    group, causes = answer("RuntimeError: HIP error: invalid device function\nOn a Ryzen 7 7700 "
                           "with Radeon Graphics iGPU beside an RX 7900 XTX")
    assert not group and causes[:1] == ["rocm.igpu-selected"], causes
