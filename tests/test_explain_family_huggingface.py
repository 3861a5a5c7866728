"""The Hugging Face family parser (doctor/explain/families/huggingface.py) on real texts: the
symptom fixtures of the huggingface table (tests/fixtures/explain_symptoms/huggingface.jsonl)
read into their parts and mode; texts of other families and empty text give no reading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsenv.doctor.explain.families import hub_repos, huggingface, python
from tests.harness import symptoms

SYMPTOMS = Path(__file__).parent / "fixtures" / "explain_symptoms"


def _rows(stem: str) -> list[dict]:
    return symptoms.rows(stem)


ROWS = _rows("huggingface")


def _text(url_end: str) -> str:
    return symptoms.text(ROWS, url_end)


def _parts(text: str, mode: str) -> dict[str, str]:
    return symptoms.parts(huggingface, text, mode)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_symptom_reads_into_its_mode(row):
    """By the Hub family (what the Hub says of one repository first: hub_repos.py), or for a
    huggingface_hub module another package still imports (huggingface_hub.utils._errors) by
    the python one."""
    readings = (hub_repos.read(row["text"]) or huggingface.read(row["text"])
                or python.read(row["text"]))
    assert [r.mode for r in readings] == [row["mode"]]


def test_a_proxy_refusing_credentials_names_host_and_status():
    parts = _parts(_text("huggingface_hub/issues/2625"), "hf.proxy-required")
    assert (parts["exception"], parts["host"], parts["status"]) == ("ProxyError",
                                                                    "huggingface.co", "407")


def test_a_server_error_names_its_status_and_repository():
    parts = _parts(_text("huggingface_hub/issues/1516"), "hf.hub-transient-outage")
    assert (parts["status"], parts["repo"]) == ("504", "Antreas/timm-ade20k-debug-137")


def test_a_gated_repository_is_named():
    parts = _parts(_text("gemma3-object-detection/issues/5"), "hf.gated-repo-auth")
    assert (parts["status"], parts["repo"]) == ("403", "google/gemma-3-4b-pt")


def test_the_errno_of_flock_tells_crash_from_hang():
    assert _parts(_text("huggingface_hub/issues/2399"), "cache.hub-no-flock")["errno"] \
        .startswith("38")
    assert _parts(_text("datasets/issues/1672"), "cache.datasets-lock-hang")["errno"] \
        .startswith("37")


def test_a_cache_folder_at_the_root_means_home_is_slash():
    # /.cache (or /.triton, /.config) is ~ resolved with HOME=/; a home of its own that cannot
    # be written stays the Hugging Face cache's mode, and Triton's own folder its own.
    assert _parts(_text("kserve/kserve/issues/3562"), "cache.xdg-cache-not-writable")["path"] \
        == "/.cache/huggingface/hub"
    assert _parts(_text("kubeflow/mcp-server/pull/83"), "cache.xdg-cache-not-writable")["path"] \
        == "/.cache"
    root_triton = "PermissionError: [Errno 13] Permission denied: '/.triton'"
    assert [r.mode for r in huggingface.read(root_triton)] == ["cache.xdg-cache-not-writable"]
    assert [r.mode for r in huggingface.read(_text("server/issues/7015"))] \
        == ["cache.hf-home-not-writable"]
    assert huggingface.read("PermissionError: [Errno 13] Permission denied: "
                            "'/app/aphrodite-engine/.triton'") == []


def test_a_hub_lock_waited_on_forever_is_a_stale_lock_unless_flock_is_missing():
    assert _parts(_text("huggingface_hub/issues/2543"), "cache.hub-stale-download-lock")["lock"] \
        .endswith("/hub/.locks/models--NousResearch--Meta-Llama-3.1-8B-Instruct/"
                  "fc1cdddd6bfa91128d6e94ee73d0ce62bfcdb7af29e978ddcab30c66ae9ea7fa.lock")
    # another report of the wait, lower-case as older huggingface_hub printed it; datasets'
    # cache lock is the network file system's mode.
    assert _parts(_text("HuggingFace-Download-Accelerator/issues/30"),
                  "cache.hub-stale-download-lock")["lock"] \
        .startswith("/home/duantong/.cache/huggingface/hub/.locks/")
    assert [r.mode for r in huggingface.read(_text("datasets/issues/3983"))] \
        == ["cache.datasets-lock-hang"]
    # SoftFileLock's fallback on a file system without flock says why the lock stays.
    fallback = ("FileSystem does not appear to support flock. Falling back to SoftFileLock for "
                "/model_dir/.cache/huggingface/.gitignore.lock\nStill waiting to acquire lock on "
                "/model_dir/.cache/huggingface/.gitignore.lock (elapsed: 10.0 seconds)")
    assert "cache.hub-stale-download-lock" not in [r.mode for r in huggingface.read(fallback)]


def test_the_removed_name_is_read():
    parts = _parts(_text("Hunyuan3D-1/issues/59"), "hf.hub-version-api-removed")
    assert (parts["name"], parts["module"]) == ("cached_download", "huggingface_hub")


def test_a_certificate_for_another_host_is_not_tls_inspection():
    # The wording of requests/urllib3 when something other than the Hub answers (a firewall
    # where only the site proxy may go out), next to a re-signed chain (inspection).
    other = ("requests.exceptions.SSLError: HTTPSConnectionPool(host='huggingface.co', "
             "port=443): Max retries exceeded with url: /org/model/resolve/main/config.json "
             "(Caused by SSLError(SSLCertVerificationError(1, \"[SSL: CERTIFICATE_VERIFY_FAILED] "
             "certificate verify failed: Hostname mismatch, certificate is not valid for "
             "'huggingface.co'. (_ssl.c:1007)\")))")
    assert [r.mode for r in huggingface.read(other)] == ["hf.proxy-required"]
    assert [r.mode for r in huggingface.read(_text("FastChat/issues/2739"))] \
        == ["hf.ssl-interception"]


def test_a_dataset_script_of_its_own_is_not_an_old_loader():
    # xsum.py needs the network with any datasets release; csv.py does not since 1.3.
    text = ("ConnectionError: Couldn't reach https://raw.githubusercontent.com/huggingface/"
            "datasets/1.2.1/datasets/xsum/xsum.py")
    assert huggingface.read(text) == []
    parts = _parts(_text("datasets/issues/1771"), "hf.datasets-too-old-for-loader")
    assert (parts["version"], parts["loader"]) == ("1.2.1", "csv")


def test_a_script_absent_at_the_installed_release_is_an_old_datasets():
    parts = _parts(_text("datasets/issues/2707"), "hf.datasets-too-old-for-loader")
    assert (parts["version"], parts["loader"]) == ("1.1.2", "lama")
    # a branch name is no release: a script missing on master says nothing about the version
    # (ylsung/Ladder-Side-Tuning#7: a typo in the dataset name)
    text = ("FileNotFoundError: Couldn't find remote file with version master at https://raw."
            "githubusercontent.com/huggingface/datasets/master/datasets/glue/glue.py")
    assert huggingface.read(text) == []
    text = ("FileNotFoundError: Couldn't find file at https://raw.githubusercontent.com/"
            "huggingface/datasets/master/datasets/glue/glue.py")
    assert huggingface.read(text) == []


def test_other_locks_are_not_the_hub_cache():
    text = "PermissionError: [Errno 13] Permission denied: '/tmp/triton/d645ef562cfc8f31.lock'"
    assert huggingface.read(text) == []


@pytest.mark.parametrize("stem", ["comm", "build", "system"])
def test_other_families_give_no_reading(stem):
    path = SYMPTOMS / f"{stem}.jsonl"
    if not path.exists():
        pytest.skip(f"{stem}.jsonl not written yet")
    rows = _rows(stem)
    # The home-quota and host symptoms mention Hugging Face paths but no Hub failure.
    read = {r["url"]: [x.mode for x in huggingface.read(r["text"])] for r in rows}
    assert not {url: modes for url, modes in read.items() if modes}


def test_empty_text_gives_no_reading():
    assert huggingface.read("") == []
    assert huggingface.read("   \n") == []


def test_a_model_type_transformers_does_not_know():
    """transformers' own message names the model type; older releases raise a bare KeyError
    from CONFIG_MAPPING in configuration_auto.py (the frames are what say so: a KeyError
    elsewhere is the code's own)."""
    parts = _parts(_text("1038lab/ComfyUI-QwenVL/issues/3"), "hf.transformers-too-old-for-model")
    assert parts["model type"] == "qwen3_vl"
    old = ('  File "/env/lib/python3.11/site-packages/transformers/models/auto/'
           'configuration_auto.py", line 723, in __getitem__\n    raise KeyError(key)\n'
           "KeyError: 'qwen2'")
    assert [r.mode for r in huggingface.read(old)] == ["hf.transformers-too-old-for-model"]
    assert not huggingface.read('  File "train.py", line 12, in <module>\n'
                                "    cfg = CONFIGS[name]\nKeyError: 'qwen2'")


def test_xet_transfers_failing_are_read_apart_from_the_hub():
    # the Xet host and the certificate failure on separate lines of the paste
    parts = _parts(_text("kodit/issues/145"), "hf.xet-transfer-blocked")
    assert (parts["xet host"], parts["failure"]) == ("cas-server.xethub.hf.co",
                                                      "Invalid certificate(UnknownIssuer)")
    # the same DNS failure for huggingface.co itself is a node without outbound access
    text = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', "
            "port=443): Max retries exceeded with url: /api/models/gpt2 (Caused by "
            "NewConnectionError('Failed to establish a new connection: [Errno -2] Name or "
            "service not known'))")
    assert [r.mode for r in huggingface.read(text)] == ["cache.hf-online-on-offline-node"]



def test_a_refused_token_is_not_a_missing_repository():
    # huggingface_hub words a refused token as 'Repository Not Found'; the Hub's own body
    # says the credentials were refused
    parts = _parts(_text("silnlp/issues/791"), "hf.token-rejected")
    assert (parts["status"], parts["refused"]) == ("401", "token")
    assert [r.mode for r in huggingface.read(_text("hf-llm.rs/issues/4"))] == ["hf.token-rejected"]
    # a gated repository's 401 stays the gated mode
    assert [r.mode for r in huggingface.read(
        "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-2-7b-hf/"
        "resolve/main/config.json. Access to model meta-llama/Llama-2-7b-hf is restricted.")] == [
        "hf.gated-repo-auth"]


def test_a_bare_403_on_a_repository_file_is_the_gate():
    # older huggingface_hub and Rust's hf-hub print only the status and the URL
    parts = _parts(_text("cantrell/stable-diffusion-api-server/issues/3"), "hf.gated-repo-auth")
    assert (parts["status"], parts["repo"]) == ("403", "CompVis/stable-diffusion-v1-4")
    parts = _parts(_text("mistral.rs/issues/621"), "hf.gated-repo-auth")
    assert parts["status"] == "403"
    # a 403 on a write (a read token creating a repository) is no gate; a region block or a
    # proxy answering 403 is not either
    assert huggingface.read("requests.exceptions.HTTPError: 403 Client Error: Forbidden for "
                            "url: https://huggingface.co/api/repos/create") == []
    blocked = ("requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: https://"
               "huggingface.co/org/model/resolve/main/model.gguf\nx-error-message: This model "
               "is not available in your region.")
    assert huggingface.read(blocked) == []
    assert huggingface.read("requests.exceptions.HTTPError: 403 Client Error: Forbidden for "
                            "url: https://example.com/org/model/resolve/main/config.json") == []


def test_the_size_check_names_the_file_and_both_sizes():
    parts = _parts(_text("Liu-Shihao/transformers-course/issues/1"), "cache.hf-truncated-download")
    assert (parts["file"], parts["expected size"], parts["size"]) == (
        "(…)l-00001-of-00002.bin", "9449717937", "883464076")
    # more bytes than announced is the same broken transfer (the maintainer's diagnosis)
    parts = _parts(_text("h2o-llmstudio/issues/860"), "cache.hf-truncated-download")
    assert (parts["expected size"], parts["size"]) == ("4999819336", "14099570832")
    # a size of 0 announced is the client's own bug (huggingface_hub#2372), no broken download
    assert huggingface.read("OSError: Consistency check failed: file should be of size 0 but "
                            "has size 6226 (multilingual-sentiments.py).") == []


def test_the_cache_refused_by_its_name_or_on_a_read_only_mount():
    # HF_HOME on a bind-mounted volume owned by another uid: the folder named huggingface
    parts = _parts(_text("tt-inference-server/issues/4574"), "cache.hf-home-not-writable")
    assert (parts["path"], parts["refused"]) == (
        "/home/container_app_user/cache_root/huggingface", "permission")
    # a shared cache mounted read-only: any path under it
    parts = _parts(_text("executorch/pull/20782"), "cache.hf-home-not-writable")
    assert (parts["path"], parts["refused"]) == ("/mnt/hf_cache/...", "read-only file system")
    assert [r.mode for r in huggingface.read(
        "PermissionError: [Errno 13] Permission denied: '/root/.cache/huggingface/token'")] \
        == ["cache.hf-home-not-writable"]
    # healthy twins: the client's own temporary paths outside the cache, its warnings that it
    # ignored a refused write, a read-only path that is no cache, another user's repository
    # folder (the shared-lock mode)
    for text in ("OSError: [Errno 30] Read-only file system: '/tmpju25ukrd'",
                 "Could not set the permissions on the file '/data/.cache/huggingface/download/"
                 "x.incomplete'. Error: [Errno 30] Read-only file system: '/data/.cache/"
                 "huggingface/download/tmp_1'.\nContinuing without setting permissions.",
                 "OSError: [Errno 30] Read-only file system: '/comfyui'",
                 "OSError: [Errno 30] Read-only file system: '/opt/app/outputs/run1'"):
        assert "cache.hf-home-not-writable" not in [r.mode for r in huggingface.read(text)], text
    shared = ("PermissionError: [Errno 13] Permission denied: '/shared/hf/hub/models--org--m/"
              "blobs/abc.incomplete'")
    assert [r.mode for r in huggingface.read(shared)] == ["cache.hub-shared-lock-perms"]


def test_a_datasets_older_than_its_fsspec():
    for url in ("datasets/issues/6737", "colabtools/issues/5338", "transformers/pull/27010"):
        parts = _parts(_text(url), "env.package-version-mismatch")
        assert parts["requires"] == "datasets newer than its fsspec", url
    # fsspec's glob refusing a pattern of the code's own is no other wording of it
    assert huggingface.read("ValueError: Invalid pattern: 'data**' is not a valid glob") == []


def test_a_tokenizer_json_newer_than_tokenizers_names_the_part():
    assert _parts(_text("HiRED/issues/3"), "hf.tokenizers-too-old")["part"] == "ModelWrapper"
    assert _parts(_text("sentence-transformers/issues/1069"), "hf.tokenizers-too-old")["part"] \
        == "PyPreTokenizerTypeWrapper"
    # a tokenizer.json that is no JSON at all (an HTML page, a pointer file) is another failure
    assert huggingface.read("Exception: expected value at line 1 column 1") == []


def test_hf_transfer_failing_mid_download_is_not_hf_transfer_missing():
    parts = _parts(_text("HuggingFace-Download-Accelerator/issues/5"),
                   "hf.hf-transfer-download-failed")
    assert (parts["client"], parts["variable"]) == ("hf_transfer", "HF_HUB_ENABLE_HF_TRANSFER")
    # the Rust error under hf_transfer.download() alone names it too (huggingface_hub#3008)
    assert [r.mode for r in huggingface.read(_text("huggingface_hub/issues/3008"))] \
        == ["hf.hf-transfer-download-failed"]
    # healthy twins: the variable set without the package is the other mode; hf_transfer's
    # progress and the client's notice that it is used are no failure
    assert [r.mode for r in huggingface.read(
        "ValueError: Fast download using 'hf_transfer' is enabled (HF_HUB_ENABLE_HF_TRANSFER=1) "
        "but 'hf_transfer' package is not available in your environment.")] \
        == ["hf.hf-transfer-missing"]
    for text in ("model-00001-of-00004.safetensors: 100%|██████████| 4.98G/4.98G [00:31<00:00, "
                 "160MB/s]", "Using hf_transfer for faster downloads (HF_HUB_ENABLE_HF_TRANSFER=1)"):
        assert huggingface.read(text) == [], text


def test_a_datasets_that_subclasses_pyarrow_PyExtensionType():
    for url in ("torchtune/pull/2955", "xTuring/pull/292", "geoai/pull/220"):
        parts = _parts(_text(url), "env.package-version-mismatch")
        assert parts["found"] == "pyarrow without PyExtensionType", url
    # pyarrow's deprecation warning of the same class (pyarrow 14-20) is no failure
    assert huggingface.read(
        "FutureWarning: pyarrow.PyExtensionType is deprecated and will refuse deserialization by "
        "default. Instead, please derive from pyarrow.ExtensionType") == []


def test_xet_writing_to_a_full_disk_is_not_the_xet_hosts():
    full = "RuntimeError: Data processing error: CAS service error : IO Error: No space left " \
           "on device (os error 28)"
    assert "hf.xet-transfer-blocked" not in [r.mode for r in huggingface.read(full)]
    # the twin: the same error with a transfer that broke off stays the Xet mode's
    broke = full.replace("IO Error: No space left on device (os error 28)",
                         "Error : single flight error: Real call failed: CasObjectError("
                         "InternalIOError(Custom { kind: Other, error: reqwest::Error { kind: "
                         "Decode, source: hyper::Error(Body, Custom { kind: UnexpectedEof, error: "
                         "IncompleteBody }) } }))")
    assert [r.mode for r in huggingface.read(broke)] == ["hf.xet-transfer-blocked"]


def test_a_tokenizer_model_sentencepiece_cannot_parse_names_the_file():
    # both wordings (sentencepiece >= 0.2 names the file; older ones the failed ParseFromArray)
    new = _parts(_text("Langchain-Chatchat/issues/3103"), "hf.tokenizer-model-unreadable")
    assert new["file"] == "chatglm3-6b/tokenizer.model"
    old = _parts(_text("zai-org/ChatGLM3/issues/88"), "hf.tokenizer-model-unreadable")
    assert old["file"] == "tokenizer.model"
    # a healthy load that only mentions the tokenizer's file gives no reading
    healthy = "[INFO|tokenization_utils_base.py:2287] >> loading file tokenizer.model\nsentencepiece loaded"
    assert not [r for r in huggingface.read(healthy) if r.mode == "hf.tokenizer-model-unreadable"]


def test_a_dotted_model_folder_is_read_only_with_the_folder_in_the_text():
    """trust_remote_code's module named after the folder cut at its dot (QwenLM/Qwen3#384:
    Qwen1.5_Pretrain_merge -> transformers_modules.Qwen1): read with the folder; the module
    missing without any dotted folder in the text (intel/ipex-llm#10017, a transformers
    version mismatch) is not this."""
    got = huggingface.read(_text("QwenLM/Qwen3/issues/384"))
    assert [(r.mode, dict(r.parts)["folder"]) for r in got] == [
        ("hf.remote-code-dir-name-has-dot", "Qwen1.5_Pretrain_merge")]
    assert not [r for r in huggingface.read(
        "ModuleNotFoundError: No module named 'transformers_modules.chatglm3-6b'")
        if r.mode == "hf.remote-code-dir-name-has-dot"]


def test_a_socks_proxy_without_the_clients_extra_names_the_extra_to_install():
    """httpx's words (huggingface_hub >= 1.0) ask for httpx[socks], requests' for
    requests[socks]; a SOCKS proxy that answers nothing is another failure."""
    got = dict(huggingface.read(_text("chatchat-space/Langchain-Chatchat/issues/605"))[0].parts)
    assert (got["client"], got["install"]) == ("httpx", "httpx[socks]")
    got = dict(huggingface.read(_text("psf/requests/issues/3516"))[0].parts)
    assert got["install"] == "requests[socks]"
    assert not [r for r in huggingface.read("socks5 proxy 127.0.0.1:1080: connection refused")
                if r.mode == "hf.socks-proxy-without-socks-extra"]


def test_a_model_type_pasted_alone_is_read_only_when_transformers_defines_it():
    """A bare `KeyError: 'mixtral'` (SCIR-HI/Huatuo-Llama-Med-Chinese#110) is transformers'
    CONFIG_MAPPING in a release older than the model; a type only a project registers (LLaVA's
    llava_llama, settled as installing that project's package) and an ordinary key are not."""
    assert [r.mode for r in huggingface.read(_text("Huatuo-Llama-Med-Chinese/issues/110"))] == [
        "hf.transformers-too-old-for-model"]
    for other in ("KeyError: 'llava_llama'", "KeyError: 'labels'"):
        assert not huggingface.read(other)


def test_offline_mode_refusing_the_hubs_api_is_code_calling_it():
    """A refused call of the Hub's API (/api/models/<repo>: model_info, the repo's refs) is no
    file the cache lacks: the library calls it on every load, cached or not; a refused file
    (the cache's own words, or /resolve/) stays the incomplete snapshot."""
    api = _parts(_text("vllm-project/vllm/issues/3719"), "hf.offline-code-calls-hub-api")
    assert api["api"] == "https://huggingface.co/api/models/bigcode/starcoder"
    file_ = ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
             "snapshot folder for the specified revision on the local disk and outgoing traffic "
             "has been disabled.")
    assert [r.mode for r in huggingface.read(file_)] == ["hf.offline-incomplete-snapshot"]


def _hub_client_log(monkeypatch, status: int, headers: dict[str, str]) -> str:
    """What huggingface_hub's own retry loop (utils/_http.py http_backoff) logs and raises when
    a loopback server answers every request with `status`: the real client's wording. The
    suite runs offline (HF_HUB_OFFLINE=1); these requests go to 127.0.0.1 only."""
    import http.server
    import io
    import logging
    import threading

    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    logger = logging.getLogger("huggingface_hub")
    logger.addHandler(handler)
    url = f"http://127.0.0.1:{server.server_port}/api/datasets/org/data/tree/main"
    try:
        _http.http_backoff("GET", url, max_retries=1, base_wait_time=0.05, max_wait_time=0.1,
                           retry_on_status_codes=(status,), timeout=5)
        error = ""
    except Exception as exc:  # the client's own exception after its last retry
        error = f"{type(exc).__name__}: {exc}"
    finally:
        logger.removeHandler(handler)
        server.shutdown()
        server.server_close()
    return captured.getvalue() + error


def test_the_hub_clients_rate_limit_retry_reads_as_rate_limited_whatever_the_host(monkeypatch):
    """huggingface_hub logs 'HTTP Error 429 thrown while requesting' and 'Rate limited.
    Waiting ...' (its retry loop) for a Hub behind any endpoint: the status in that wording and
    the client's own back-off line name the rate limit (datasets#6488's cause)."""
    log = _hub_client_log(monkeypatch, 429, {"Retry-After": "0"})
    assert "HTTP Error 429 thrown while requesting" in log and "Rate limited. Waiting" in log
    readings = huggingface.read(log)
    assert [r.mode for r in readings] == ["hf.rate-limited"]
    assert dict(readings[0].parts)["status"] == "429"
    # the exception the client raises after its last retry, alone (huggingface_hub >= 1.0's words)
    last = log.strip().splitlines()[-1]
    assert last.startswith("HfHubHTTPError: 429 ") and "Rate limited" not in last
    assert [r.mode for r in huggingface.read(last)] == ["hf.rate-limited"]
    assert dict(huggingface.read(last)[0].parts)["status"] == "429"


def test_another_status_in_the_same_client_wording_is_not_a_rate_limit(monkeypatch):
    """The twin: a 404 through the same retry loop is no rate limit (no Hub host, no back-off
    line), so the reading stays away from hf.rate-limited."""
    log = _hub_client_log(monkeypatch, 404, {})
    assert "HTTP Error 404 thrown while requesting" in log
    assert "hf.rate-limited" not in [r.mode for r in huggingface.read(log)]


def test_a_resume_past_the_end_is_the_stale_incomplete_file_but_xets_own_416_is_not():
    """requests'/huggingface_hub's raised 416 on a /resolve/ URL: a blobs/<etag>.incomplete
    that already holds the file; hf_xet walks segments until the server answers 416 and logs
    it as the end of a download (xet-core#939), which names nothing."""
    raised = ("huggingface_hub.utils._errors.HfHubHTTPError: 416 Client Error: Range Not "
              "Satisfiable for url: https://huggingface.co/org/repo/resolve/abc/model.bin")
    assert [r.mode for r in huggingface.read(raised)] == ["cache.hub-stale-incomplete-file"]
    xet = ("INFO api call failed: status 416 Range Not Satisfiable for url "
           "https://cas-bridge.xethub.hf.co/xorbs/default/abc")
    assert "cache.hub-stale-incomplete-file" not in [r.mode for r in huggingface.read(xet)]


def test_tokenizers_reading_a_cut_tokenizer_json_is_a_truncated_download():
    cut = "Exception: EOF while parsing a value at line 156568 column 3"
    assert [r.mode for r in huggingface.read(cut)] == ["cache.hf-truncated-download"]
    # serde's words for a JSON the program itself built are not a download's
    assert huggingface.read("error: EOF while parsing a value at line 1 column 0") == []


def test_each_withdrawn_repository_is_named_with_its_copy_and_the_catalogue_agrees():
    # hub_withdrawn.toml and hf.repo-withdrawn's patterns list the same repositories
    from dsenv.doctor import catalogue
    mode = catalogue.mode("hf.repo-withdrawn")
    for repo, row in hub_repos.withdrawn().items():
        text = (f"OSError: {repo} is not a local folder and is not a valid model identifier "
                "listed on 'https://huggingface.co/models'")
        got = symptoms.parts(hub_repos, text, "hf.repo-withdrawn")
        assert got["repo"] == repo and got["use instead"] == row["instead"], repo
        assert any(re.search(p, text) for p in mode.match), repo
        url = f"Repository Not Found for url: https://hf-mirror.com/api/models/{repo}/revision/main."
        assert [r.mode for r in hub_repos.read(url)] == ["hf.repo-withdrawn"], repo
        assert any(re.search(p, url) for p in mode.match), repo


@pytest.mark.parametrize("repo", ["stabilityai/stable-diffusion-xl-base-1.0",
                                  "CompVis/stable-diffusion-v1-4", "runwayml/stable-diffusion",
                                  "huggyllama/llama-7b", "stable-diffusion-v1-5/stable-diffusion-v1-5"])
def test_a_repository_not_listed_as_withdrawn_is_not_named(repo):
    # the Hub refuses a typo, a private repository and a deleted one in the same words
    from dsenv.doctor import catalogue
    text = (f"OSError: {repo} is not a local folder and is not a valid model identifier "
            "listed on 'https://huggingface.co/models'")
    assert hub_repos.read(text) == []
    assert not any(re.search(p, text) for p in catalogue.mode("hf.repo-withdrawn").match)


def test_the_withdrawn_sentence_without_its_exception_is_the_root_error():
    from dsenv.doctor.explain.command import explain_text
    text = symptoms.text(ROWS, "HYPIR/issues/49")
    assert not text.startswith("OSError")
    _, _, sure, _ = explain_text(text)
    assert sure and sure[0].id == "hf.repo-withdrawn"


def test_a_429_on_an_uploads_commit_is_the_commit_quota_not_the_download_limit():
    commit = symptoms.text(ROWS, "datasets/issues/6257")
    got = symptoms.parts(hub_repos, commit, "hf.commit-rate-limited")
    assert got["repo"] == "yuvalkirstain/pickapic_v2"
    assert "hf.rate-limited" not in [r.mode for r in huggingface.read(commit)]
    download = commit.replace("/commit/main", "/revision/main")
    assert hub_repos.read(download) == []
    assert [r.mode for r in huggingface.read(download)] == ["hf.rate-limited"]
    quota = symptoms.text(ROWS, "braindecode/issues/947")
    assert symptoms.parts(hub_repos, quota, "hf.commit-rate-limited")["limit"] == \
        "128 commits per hour"


def test_a_cli_subcommand_the_installed_hub_lacks_says_which_release():
    old = symptoms.parts(hub_repos, symptoms.text(ROWS, "huggingface_hub/issues/1105"),
                         "hf.hub-version-api-removed")
    assert old["command"] == "huggingface-cli download" and "< 0.17" in old["installed"]
    gone = symptoms.parts(hub_repos, symptoms.text(ROWS, "platform-docs-public/pull/462"),
                          "hf.hub-version-api-removed")
    assert ">= 1.0" in gone["installed"]
    assert hub_repos.read("huggingface-cli: error: invalid choice: 'lfs-enable'") == []
    assert hub_repos.read("") == []


@pytest.mark.parametrize("why,mode", [
    ("certificate is not yet valid", "system.clock-behind-tls"),
    ("self-signed certificate in certificate chain", "hf.ssl-interception"),
])
def test_a_certificate_not_yet_valid_is_the_clock_not_a_proxy(why, mode):
    from dsenv.doctor.explain.command import explain_text
    text = ("requests.exceptions.SSLError: HTTPSConnectionPool(host='huggingface.co', port=443): "
            "Max retries exceeded with url: /api/models/gpt2 (Caused by SSLError("
            "SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
            f"failed: {why} (_ssl.c:1006)')))")
    _, _, sure, _ = explain_text(text)
    assert sure and sure[0].id == mode
