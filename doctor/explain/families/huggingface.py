"""Hugging Face Hub, transformers and datasets messages read by structure.

The Hub client reports a failed request in a few stable shapes, whatever the release:
``requests``/``urllib3``/``httpx`` errors naming the pool (``HTTPSConnectionPool(host='X',
port=443): Max retries exceeded with url: /PATH (Caused by ProxyError|SSLError|
ConnectTimeoutError|NewConnectionError(...))``), huggingface_hub's HTTP errors with their
status (``HfHubHTTPError: 504 Server Error: ... for url: URL``, ``GatedRepoError: 401 Client
Error``, ``RepositoryNotFoundError``), the cache lookups that follow a failed request
(``LocalEntryNotFoundError``, transformers' ``We couldn't connect to 'https://huggingface.co'``,
datasets' ``Couldn't reach 'NAME' on the Hub (ConnectionError)``), offline mode refusing a
request (``OfflineModeIsEnabled``, ``outgoing traffic has been disabled``), file locks in the
cache (``fcntl.flock`` with its errno, ``PermissionError`` on a ``.lock``), and imports of
names a release removed. The parts read here: the exception, the host, the HTTP status, the
repository, the cause urllib3 names; small rules map them to catalogue modes.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading
from dsenv.doctor.explain.families.hub_repos import COMMIT_URL
from dsenv.doctor.explain.families.stack_api import HUB_KWARG, HUB_KWARG_RELEASE

FAMILY = "huggingface"

# Hosts the Hub client talks to: huggingface.co, its CDN (cdn-lfs.huggingface.co, cas-bridge
# .xethub.hf.co), hf-mirror.com, and raw.githubusercontent.com (datasets' old script loader).
_HUB_HOST = re.compile(r"(?:^|\.)(?:huggingface\.co|hf\.co|hf-mirror\.com)$")
_HOST = re.compile(r"host='(?P<pool>[^']+)'|https?://(?P<url>[\w.-]+\.[a-z]{2,})", re.I)
# The status in each client's wording: requests' "429 Client Error", huggingface_hub's retry
# warning "HTTP Error 429 thrown while requesting", urllib's "HTTP Error 429:", hf-hub's Rust
# "HTTP status client error (429 Too Many Requests)", huggingface_hub >= 1.0's "429 Too Many
# Requests for url:" and httpx's "Client error '429 Too Many Requests' for url".
_STATUS = re.compile(r"\b(?P<status>[45]\d\d) (?:Client|Server) Error\b|\((?P<status2>[45]\d\d) "
                     r"Too Many Requests\)|Tunnel connection failed: (?P<status3>\d{3})"
                     r"|\bHTTP Error (?P<status4>[45]\d\d)\b"
                     r"|HTTP status (?:client|server) error \((?P<status5>[45]\d\d)\b"
                     r"|\b(?P<status6>[45]\d\d) [A-Z][A-Za-z -]{1,40}'? for url\b", re.I)
_RANGE_PAST_END = re.compile(r"416 Client Error: (?:Requested )?Range Not Satisfiable")
# tokenizers (Rust serde_json) reading a tokenizer.json cut short or empty
_TOKENIZER_EOF = re.compile(r"(?:^|\n)\s*(?:Exception: |failed to load tokenizer: )EOF while parsing "
                            r"(?:a value|an object|a string|a list) at line \d+ column \d+")
# huggingface_hub's own back-off line (utils/_http.py) on a 429: the Hub client, whatever host.
_HUB_BACKOFF = re.compile(r"Rate limited\. Waiting [\d.]+s before retry")
_EXCEPTION = re.compile(r"\b(?P<exc>GatedRepoError|RepositoryNotFoundError|RevisionNotFoundError|"
                        r"EntryNotFoundError|LocalEntryNotFoundError|HfHubHTTPError|"
                        r"OfflineModeIsEnabled|IncompleteSnapshotError|ProxyError|SSLError|"
                        r"ConnectTimeout(?:Error)?|ReadTimeout(?:Error)?|NewConnectionError|"
                        r"ConnectionError)\b")
_REPO = re.compile(r"Access to model (?P<repo>[\w.-]+/[\w.-]+)|cached snapshot for '(?P<repo2>[^']+)'"
                   r"|huggingface\.co/(?:api/(?:models|datasets|spaces)/|datasets/)?(?!api/)"
                   r"(?P<repo3>[\w.-]+/[\w.-]+)")
# cached_download is huggingface_hub's own name: a paste without "from ..." is the same import
_REMOVED = re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>huggingface_hub[\w.]*)'"
                      r"|cannot import name '(?P<own>cached_download)'")
_FLOCK = re.compile(r"flock\(.*?\[Errno (?P<errno>\d+)\] (?P<why>[\w /]+)", re.S)
_LOCK_DENIED = re.compile(r"Permission denied: '(?P<path>[^']*(?:\.lock|/\.locks/[^']*|"
                          r"/(?:hub|huggingface)/(?:models|datasets)--[^']*))'")
_OTHER_CACHE = re.compile(r"\.triton\b|/triton/|torch_extensions", re.I)  # their own modes
_HOME_DENIED = re.compile(r"problem when trying to write in your cache folder \((?P<path>[^)]*)\)"
                          r"|Permission denied: '(?P<path2>(?:[^']*/)?\.cache(?:/huggingface"
                          r"(?:/hub)?)?/?)'")
# The cache's own folders or token by their names, wherever HF_HOME put them (a volume's
# cache_root/huggingface, /mnt/hf_cache): the folder (or the token in it) refused to the job's
# user, or every path on a read-only mount (a pre-seeded cache, a container's image); the
# client's own warnings that it ignored such an error are not the failure.
_CACHE_NAMED = re.compile(r"(?:Permission denied|Read-only file system): '(?P<path>[^'\n]*)'")
_CACHE_DIR = re.compile(r"(?:^|/)(?:\.cache/huggingface|huggingface|hf[_-]?(?:cache|home))"
                        r"(?:/(?:hub|datasets|xet|assets|token))?/?$", re.I)
_CACHE_UNDER = re.compile(r"(?:^|/)(?:\.cache/huggingface|huggingface|hf[_-]?(?:cache|home))(?:/|$)",
                          re.I)
_IGNORED = re.compile(r"Will ignore error and continue|Continuing without|Ignored error while")
# A cache or config folder directly under /: the job's HOME is / (an arbitrary UID in a pod),
# so every library's ~/.cache, ~/.config, ~/.triton lands at the root of the image.
_ROOT_HOME = re.compile(r"Permission denied: '(?P<path>/\.(?:cache|config|triton|local)(?:/[^']*)?)'"
                        r"|problem when trying to write in your cache folder \((?P<path2>/\.cache/"
                        r"[^)]*)\)")
_STALE_LOCK = re.compile(r"Still waiting to acquire lock on (?P<path>[^\s()]+)"
                         r"|Lock \d+ not acquired on (?P<path2>\S*/hub/\.locks/\S+?\.lock)", re.I)
_DATASETS_SCRIPT = re.compile(r"Couldn't reach https://raw\.githubusercontent\.com/huggingface/"
                              r"datasets/(?P<version>[\w.]+)/(?:datasets|metrics)/(?P<name>[\w-]+)/")
# A dataset added to the library after the installed release: its script is not at that
# release's tag at all (404, "Couldn't find file"), whatever the network (datasets#1444, #2707).
_DATASETS_SCRIPT_ABSENT = re.compile(
    r"Couldn't find file (?:locally at \S+, or remotely )?at https://raw\.githubusercontent\.com/"
    r"huggingface/datasets/(?P<version>\d[\w.]*)/(?:datasets|metrics)/(?P<name>[\w-]+)/")
# The generic loaders later datasets releases bundle (a dataset's own script, xsum.py, still
# needs the network with any release: failing to fetch it says nothing about the version).
_PACKAGED = {"csv", "json", "text", "pandas", "parquet", "arrow", "sql", "generator",
             "imagefolder", "audiofolder", "videofolder", "webdataset"}
_HUB_REACH = re.compile(r"Couldn't reach '(?P<name>[^']+)' on the Hub \((?P<why>\w+)\)")
# The libraries' words for "the request did not get an answer" (DNS, route, timeout, refused).
_NO_ROUTE = re.compile(r"ConnectTimeout|timed out|NewConnectionError|Failed to establish a new "
                       r"connection|Name or service not known|Temporary failure in name "
                       r"resolution|Network is unreachable|No route to host|Connection refused|"
                       r"We couldn't connect to 'https?://|Connection error, and we cannot find|"
                       r"error happened while trying to locate the files? on the Hub", re.I)
_OFFLINE = re.compile(r"OfflineModeIsEnabled|offline mode is enabled|[Oo]utgoing traffic (?:has "
                      r"been|is) disabled|IncompleteSnapshotError|Cannot find an appropriate "
                      r"cached snapshot folder|Couldn't find cache for \S+ for config|no file "
                      r"named \S+ found in directory \S*/snapshots/")

_OFFLINE_API = re.compile(r"Cannot reach\s+(?P<api>https?://\S+?/api/(?:models|datasets|spaces)/\S+?)"
                          r":? offline mode is enabled", re.I)

# hf_xet: its Python error ("Data processing error: CAS service error"), its Rust client's log
# records (cas_client/src/*.rs) or a request to a *.xethub.hf.co host that failed.
_XET = re.compile(r"CAS service error[^\n]*|cas_client/src/\w+\.rs|https?://[\w-]+\.xethub\.hf\.co"
                  r"\S*[^\n]*?(?:InvalidCertificate|UnknownIssuer|dns error|ConnectFailed|"
                  r"ConnectError|timed out)")
_REQWEST = re.compile(r"\breqwest::(?:E|e)rror\b")
# hf_xet's own I/O failing on a full disk says nothing about its hosts (the cache's folder is
# full: cache.home-quota's words, left to the catalogue).
_XET_DISK_FULL = re.compile(r"No space left on device|os error 28\b|Disk quota exceeded")
# hf_transfer (HF_HUB_ENABLE_HF_TRANSFER=1): huggingface_hub's wrapper around a failed Rust
# download, or the Rust error under hf_transfer.download() itself.
_HF_TRANSFER_FAILED = re.compile(r"An error occurred while downloading using `?hf_transfer`?"
                                 r"|hf_transfer\.download\([\s\S]{0,300}?Exception: Error while "
                                 r"(?:downloading|removing corrupted file)[^\n]*")
# pyarrow 21 removed PyExtensionType, which datasets releases before 2.15 subclass at import
# (and before 0.17 pyarrow had none): datasets and pyarrow from releases that do not go together.
_PYARROW_EXTENSION = re.compile(r"module 'pyarrow' has no attribute 'PyExtensionType'")
_XET_WHY = re.compile(r"InvalidCertificate\(\w+\)|Invalid certificate\(\w+\)|dns error|Name or "
                      r"service not known|Request failed after \d+ retries|timed out", re.I)


# urllib3's and httpx's words for a response that did not come in time (not a connect).
_READ_TIMEOUT = re.compile(r"Read timed out\.?(?: \(read timeout=(?P<secs>[\d.]+)\))?|httpx\.ReadTimeout")
_CONNECT_FAILED = re.compile(r"ConnectTimeout|NewConnectionError|Failed to establish a new connection"
                             r"|Name or service not known|Temporary failure in name resolution"
                             r"|Network is unreachable|No route to host|Connection refused", re.I)


# A bare 403 on a repository file: older huggingface_hub (before GatedRepoError) and other
# clients (Rust's hf-hub) print only the status and the URL; on /resolve/ it is the gate
# refusing an account without access, unless the Hub says the region is blocked or a proxy
# answered (mode's `against`).
_FORBIDDEN_FILE = re.compile(r"(?:403 Client Error: Forbidden for url:?|status: 403, status_text: "
                             r"Forbidden, url:) (?P<url>https?://[\w.-]+/\S+?/resolve/\S+)")
_FORBIDDEN_ELSEWHERE = re.compile(r"not available in your region|ProxyError|Tunnel connection "
                                  r"failed", re.I)


_TOKEN_REFUSED = re.compile(r"Invalid credentials in Authorization header|Authorization header is "
                            r"correct, but the token seems invalid")


# huggingface_hub's check of a finished download against the size the Hub announced: the
# expected size, the size on disk and the file (its name shortened with "(…)" when long).
_SIZE_CHECK = re.compile(r"Consistency check failed: file should be of size (?P<expected>\d+) but "
                         r"has size (?P<got>\d+)(?: \((?P<file>(?:\(…\)|\(\.\.\.\))?[^()\n]*)\))?")
# datasets releases older than the installed fsspec (2023.10 changed its glob and its protocol
# names): the data-file patterns, or a dataset cached on local disk, are refused.
_FSSPEC_NEWER = re.compile(r"Invalid pattern: '\*\*' can only be an entire path component"
                           r"|Loading a (?:streaming )?dataset cached in a LocalFileSystem is not supported")
# tokenizers parsing a tokenizer.json written by a newer release (0.20's BPE merges as pairs,
# newer pre-tokenizer and normalizer options): serde names the Python wrapper it could not fill.
_TOKENIZER_JSON = re.compile(r"data did not match any variant of untagged enum "
                             r"(?P<part>Model|Py\w*?)Wrapper(?: at line \d+ column \d+)?")
# SentencePiece refusing the file it was given as tokenizer.model (sentencepiece >= 0.2 names the
# file; older releases name only the failed ParseFromArray): not a SentencePiece model at all.
_SPM_UNREADABLE = re.compile(r"could not parse ModelProto from (?P<file>\S+)"
                             r"|sentencepiece_processor\.cc\(\d+\) \[model_proto->ParseFromArray\(")


def _cache_refused(message: str) -> re.Match | None:
    """The cache folder (or its token) refused by name, or any path under it on a read-only
    file system; another user's lock or repository folder is the shared-lock mode's."""
    for m in _CACHE_NAMED.finditer(message):
        # the warning's line and the one after it ("Continuing without setting permissions.")
        end = message.find("\n", message.find("\n", m.end()) + 1)
        line = message[message.rfind("\n", 0, m.start()) + 1:end if end > m.end() else None]
        if _IGNORED.search(line) or _OTHER_CACHE.search(m["path"]):
            continue
        if _CACHE_DIR.search(m["path"]) or ("Read-only" in m[0] and _CACHE_UNDER.search(m["path"])):
            return m
    return None


def _hosts(message: str) -> list[str]:
    return [(m["pool"] or m["url"]).lower() for m in _HOST.finditer(message)]


# model_type values transformers itself defines: a KeyError of one pasted alone (no frames) is
# its CONFIG_MAPPING lookup in a release that predates the model; a project's own registered
# types (LLaVA's llava_llama) and ordinary keys ('labels') are not among them
UPSTREAM_TYPES = (r"llama\d*|mistral\d*|mixtral|qwen[23](?:_5)?(?:_moe|_vl|_audio)?|gemma\d*(?:_text)?"
                  r"|phi\d*(?:small|moe)?|gptj|gpt_neox|gpt_bigcode|falcon|starcoder2|mpt"
                  r"|deepseek_v[23]|cohere\d*|olmo\d*|mamba\d*|jamba|dbrx|grounding-dino|siglip"
                  r"|idefics\d*|paligemma")


def read(message: str, around: str = "") -> list[Reading]:
    if not message.strip():
        return []
    hosts = _hosts(message)
    hub = next((h for h in hosts if _HUB_HOST.search(h)), "")
    status = next((next(g for g in m.groups() if g) for m in _STATUS.finditer(message)), "")
    exc = (m := _EXCEPTION.search(message)) and m["exc"] or ""
    repo = ((m := _REPO.search(message)) and (m["repo"] or m["repo2"] or m["repo3"]) or "").rstrip(".")
    found: list[Reading] = []

    def add(mode: str, text: str, **parts: str) -> None:
        found.append(reading(FAMILY, mode, text, exception=exc, host=hub, status=status,
                             repo=repo, **parts))

    # The finished download moved from the cache into a target on another file system.
    if m := re.search(r"\[Errno 18\] Invalid cross-device link: '(?P<src>[^']*huggingface[^']*)' -> "
                      r"'(?P<dst>[^']*)'", message):
        add("cache.hf-cross-device-move", m.group(0)[:160], cache=m["src"], target=m["dst"])
        return found
    # A model_type the installed transformers has no class for: its message, or (older
    # releases) the KeyError its CONFIG_MAPPING raises inside configuration_auto.py.
    unknown = re.search(r"has model type `?(?P<type>[\w.-]+?)`? but Transformers does not "
                        r"recognize this architecture", message)
    key = re.search(r"(?:configuration_auto\.py|CONFIG_MAPPING\[)[\s\S]{0,400}?KeyError: "
                    r"'(?P<type>[\w.-]+)'", message) or (re.search(
        rf"^\s*KeyError: ['\"](?P<type>{UPSTREAM_TYPES})['\"]\s*$", message, re.M)
        if 'File "' not in message else None)  # frames shown: they say whose lookup it was
    if unknown or key:
        hit = unknown or key
        add("hf.transformers-too-old-for-model", hit.group(0)[-120:], model_type=hit["type"])
        return found
    # a quantization method the checkpoint's config names that this release has no quantizer
    # for (DeepSeek-V3's fp8 before 4.49); a dtype there is a config mistake, not the release
    if m := re.search(r"Unknown quantization type, got (?!(?:bf16|fp16|float16|bfloat16|fp32|"
                      r"float32|none)\b)(?P<method>[\w-]+) - supported types are", message):
        add("hf.transformers-too-old-for-model", m[0], quantization=m["method"])
        return found
    # trust_remote_code's module is named after the model folder: a '.' in the folder's name
    # cuts it (Qwen1.5-7B -> transformers_modules.Qwen1); only with that folder in the text
    if (m := re.search(r"No module named [`'‘]?transformers_modules\.(?P<name>[\w-]+)", message)) \
            and (folder := re.search(rf"(?<![\w-]){re.escape(m['name'])}\.[\w.-]+",
                                     f"{message}\n{around}")):
        add("hf.remote-code-dir-name-has-dot", m.group(0), module=f"transformers_modules."
            f"{m['name']}", folder=folder.group(0))
        return found
    # A SOCKS proxy in the environment and the HTTP client without its SOCKS extra: httpx's
    # (huggingface_hub >= 1.0) words and requests' (older hubs, datasets)
    if m := re.search(r"Using SOCKS proxy, but the [`'‘]?socksio[’'`]? ?package is not installed"
                      r"|Missing dependencies for SOCKS support", message):
        client = "httpx" if "socksio" in m.group(0) else "requests"
        add("hf.socks-proxy-without-socks-extra", m.group(0), client=client,
            install="httpx[socks]" if client == "httpx" else "requests[socks]")
        return found
    # Llama 3.1's rope_scaling (rope_type "llama3" and its frequency factors) under a release
    # that validates the older two-field form (transformers < 4.43)
    if m := re.search(r"`?rope_scaling`? must be a dictionary with (?:with )?two fields, `?type`? "
                      r"and `?factor`?(?:, got (?P<got>\{[^}\n]*\}))?", message):
        add("hf.transformers-too-old-for-model", m.group(0)[:120], config="rope_scaling",
            needs="transformers >= 4.43.1 (Llama 3.1's rope_type llama3)",
            **({"got": m["got"][:80]} if m["got"] else {}))
        return found
    # The Trainer's W&B integration on, with no key and no terminal to ask for one.
    if m := re.search(r"api_key not configured \(no-tty\)", message):
        add("hf.wandb-no-api-key", m.group(0), integration="wandb")
        return found

    # A name huggingface_hub removed (cached_download in 0.26) or added after the installed
    # release: the import itself fails, whatever the network.
    if m := _REMOVED.search(message):
        add("hf.hub-version-api-removed", m[0], name=m["name"] or m["own"],
            module=m["module"] or "huggingface_hub")
        return found
    if (m := HUB_KWARG.search(message)) and m["kw"] in HUB_KWARG_RELEASE:
        add("hf.hub-version-api-removed", m[0], name=f"{m['fn']}({m['kw']}=...)",
            module="huggingface_hub", keyword=HUB_KWARG_RELEASE[m["kw"]])
        return found
    # datasets >= 4 refuses loading scripts outright.
    if m := re.search(r"Dataset scripts are no longer supported", message):
        script = re.search(r"no longer supported, but found ([\w.-]+\.py)", message)
        add("hf.datasets-scripts-removed", m[0], script=script[1] if script else "")
        return found
    if m := _FSSPEC_NEWER.search(message):
        add("env.package-version-mismatch", m[0], requires="datasets newer than its fsspec",
            found="fsspec 2023.10 or newer")
        return found
    if m := _TOKENIZER_JSON.search(message):
        add("hf.tokenizers-too-old", m[0], part=f"{m['part']}Wrapper")
        return found
    if m := re.search(r"Fast download using 'hf_transfer' is enabled", message):
        add("hf.hf-transfer-missing", m[0], variable="HF_HUB_ENABLE_HF_TRANSFER")
        return found
    if m := _HF_TRANSFER_FAILED.search(message):
        add("hf.hf-transfer-download-failed", m[0][-160:], client="hf_transfer",
            variable="HF_HUB_ENABLE_HF_TRANSFER")
        return found
    if m := _PYARROW_EXTENSION.search(message):
        add("env.package-version-mismatch", m[0], requires="datasets and pyarrow of one era",
            found="pyarrow without PyExtensionType")
        return found
    # hf_xet's own transfers (its Rust client, its CAS hosts) failing where huggingface.co
    # answered: the Xet hosts are blocked, unresolvable or re-signed by a proxy.
    why = _XET_WHY.search(message)
    xet_host = next((h for h in hosts if h.endswith(".xethub.hf.co")), "")
    # hf_xet's Rust client (reqwest) failing on a Xet host; the failure's words may be on
    # another line of a pasted record (kodit#145)
    if (m := _XET.search(message) or (xet_host and (why or _REQWEST.search(message)))) \
            and not _XET_DISK_FULL.search(message):
        add("hf.xet-transfer-blocked", m[0][:160], client="hf_xet", xet_host=xet_host,
            failure=why[0] if why else "")
        return found
    # Locks in the cache: flock's errno says whether the file system has no flock at all
    # (38 ENOSYS: the download crashes) or refuses/loses it (37 ENOLCK, 5 EIO: datasets'
    # lock loop waits forever); datasets' own "Lock N not acquired ... waiting" is the loop.
    if m := _FLOCK.search(message):
        mode = "cache.hub-no-flock" if m["errno"] == "38" else (
            "cache.datasets-lock-hang" if m["errno"] in ("5", "37") else "")
        if mode:
            add(mode, m[0], call="flock", errno=f"{m['errno']} {m['why'].strip()}")
            return found
    # huggingface_hub's own wait (no timeout), or filelock's debug record on a hub cache lock:
    # an earlier download left the lock (a file lock on a file system without flock is the
    # other mode's, named above by its errno or its fallback notice).
    if (m := _STALE_LOCK.search(message)) and "does not appear to support flock" not in message:
        add("cache.hub-stale-download-lock", m[0], lock=m["path"] or m["path2"])
        return found
    if m := re.search(r"Lock \d+ not acquired on (\S+\.lock)", message):
        add("cache.datasets-lock-hang", m[0], lock=m[1])
        return found
    # HOME=/: the folder refused is at the root, whichever library asked (Triton's too).
    if m := _ROOT_HOME.search(message):
        add("cache.xdg-cache-not-writable", m[0], path=m["path"] or m["path2"], home="/")
        return found
    # Another user's lock or repository folder in a shared cache (Triton's and torch
    # extensions' locks are their own modes).
    if (m := _LOCK_DENIED.search(message)) and not _OTHER_CACHE.search(m["path"]):
        add("cache.hub-shared-lock-perms", m[0], path=m["path"])
        return found
    # The cache home itself cannot be created or written (HOME unset so ~ is /, a container
    # user without a home, a read-only image): transformers' warning or the PermissionError.
    if m := _HOME_DENIED.search(message):
        add("cache.hf-home-not-writable", m[0], path=m["path"] or m["path2"])
        return found
    if m := _cache_refused(message):
        add("cache.hf-home-not-writable", m[0], path=m["path"],
            refused="read-only file system" if "Read-only" in m[0] else "permission")
        return found
    # The Hub client's size check after a download: the file on disk is not the size the Hub
    # announced (the transfer broke off or two writers met); a size of 0 announced is the
    # client's own bug (huggingface_hub#2372).
    if (m := _SIZE_CHECK.search(message)) and m["expected"] != "0":
        add("cache.hf-truncated-download", m[0][:160], file=(m["file"] or "").strip(),
            expected_size=m["expected"], size=m["got"])
        return found
    # A weight file cut short by an interrupted download: safetensors cannot read its header.
    if m := re.search(r"Error while deserializing header: (MetadataIncompleteBuffer|"
                      r"HeaderTooLarge|InvalidHeaderDeserialization)", message):
        add("cache.hf-truncated-download", m[0], header=m[1])
        return found
    # torch.load's zip reader found no end record: the file was cut short (a download that
    # stopped, or a checkpoint whose save died: alternatives.toml zip-cut-short)
    if m := re.search(r"PytorchStreamReader failed reading zip archive: failed finding central "
                      r"directory", message):
        add("cache.hf-truncated-download", m[0], reader="torch.load (zip format)")
        return found
    if m := _TOKENIZER_EOF.search(message):
        add("cache.hf-truncated-download", m[0].strip(), reader="tokenizers (tokenizer.json)")
        return found
    # tokenizer.model is no SentencePiece model: cut short, a pointer or an error page, or a
    # tiktoken file (Llama 3 and later) loaded by code written for Llama 2.
    if m := _SPM_UNREADABLE.search(message):
        add("hf.tokenizer-model-unreadable", m[0][:160], file=m["file"] or "tokenizer.model")
        return found
    # The Hub answered: gated (401/403 with the gated wording), rate limit, server error.
    if re.search(r"GatedRepoError|Cannot access gated repo for url|trying to access a gated repo"
                 r"|Access to model \S+ is "
                 r"restricted", message):
        add("hf.gated-repo-auth", message[:200])
        return found
    forbidden = _FORBIDDEN_FILE.search(message)
    if forbidden and _HUB_HOST.search(_hosts(forbidden["url"])[0]) \
            and not _FORBIDDEN_ELSEWHERE.search(message):
        status = status or "403"  # hf-hub's Rust wording is not _STATUS's
        add("hf.gated-repo-auth", forbidden[0][:200], refused="repository file")
        return found
    # The Hub refused the token itself (expired, revoked, without the permission): it says so
    # in the body of its 401/400, whatever the repository.
    if m := _TOKEN_REFUSED.search(message):
        add("hf.token-rejected", m[0], refused="token")
        return found
    # (an upload's commit refused with 429 is hub_repos.py's reading, hf.commit-rate-limited)
    if status == "429" and not COMMIT_URL.search(message) \
            and (hub or "Too Many Requests" in message or _HUB_BACKOFF.search(message)):
        add("hf.rate-limited", f"{status} Too Many Requests")
        return found
    # a resumed download asking past the end: a blobs/<etag>.incomplete that already holds the
    # whole file (huggingface_hub < 0.25; hf_xet's own 416 log lines are its normal end)
    if status == "416" and (m := _RANGE_PAST_END.search(message)):
        add("cache.hub-stale-incomplete-file", m[0])
        return found
    if status.startswith("5") and hub:
        add("hf.hub-transient-outage", f"{status} Server Error")
        return found
    # Offline mode refused a call of the Hub's API (/api/models/<repo>: model_info, the repo's
    # files or refs), which no cache answers, or a file the cache could not answer
    if api := _OFFLINE_API.search(message):
        add("hf.offline-code-calls-hub-api", api[0], api=api["api"])
        return found
    if m := _OFFLINE.search(message):
        add("hf.offline-incomplete-snapshot", m[0], refused=m[0])
        return found
    # Old datasets releases fetch even the generic loaders (csv/json/text before 1.3,
    # audiofolder before 2.4) from GitHub at their own version: the download, not the data,
    # fails, and a release that bundles the loader needs no network.
    m = _DATASETS_SCRIPT.search(message)
    if m and m["name"] in _PACKAGED and "ProxyError" not in message:
        add("hf.datasets-too-old-for-loader", m[0], version=m["version"], loader=m["name"])
        return found
    m = _DATASETS_SCRIPT_ABSENT.search(message)
    if m:
        add("hf.datasets-too-old-for-loader", m[0], version=m["version"], loader=m["name"])
        return found
    reach = _HUB_REACH.search(message)
    why = reach["why"] if reach else ""
    # The request went to a proxy that failed (down, refused, 407) ...
    if re.search(r"ProxyError|Unable to connect to proxy|Cannot connect to proxy", message) \
            or why == "ProxyError":
        add("hf.proxy-required", "ProxyError", cause="proxy")
        return found
    # ... or something else answered in the Hub's place: huggingface_hub found none of the
    # Hub's own headers on the answer (a firewall's page, a proxy or mirror that drops them)
    if m := re.search(r"Distant resource does not seem to be on huggingface\.co", message):
        add("hf.proxy-required", m[0], cause="an answer without the Hub's headers")
        return found
    # ... or TLS failed: a certificate for another host means something other than the Hub
    # answered (a firewall redirect where only the proxy may go out); a self-signed or unknown
    # issuer in the chain is a TLS-inspecting proxy re-signing the Hub's certificate.
    if hub and re.search(r"SSLError|CERTIFICATE_VERIFY_FAILED", message) or why == "SSLError":
        if re.search(r"Hostname mismatch|doesn't match|not valid for '", message):
            add("hf.proxy-required", "Hostname mismatch", cause="certificate of another host")
        else:
            add("hf.ssl-interception", "CERTIFICATE_VERIFY_FAILED", cause="certificate chain")
        return found
    # A read timeout: the Hub accepted the connection and answered later than the client's
    # read timeout, so the node is not offline. Read as a slow answer (many ranks asking at
    # once, a slow link); alternatives.toml lists a degraded Hub with it, the same words.
    if hub and (m := _READ_TIMEOUT.search(message)) and not _CONNECT_FAILED.search(message):
        add("hf.hub-read-timeout", m[0], read_timeout=f"{m['secs']} s" if m["secs"] else "")
        return found
    # No answer at all from the Hub (timeout, DNS, unreachable, refused), or the libraries'
    # cache fallback saying so: a node without outbound access and offline mode unset.
    if (hub or reach or "huggingface.co" in message) and _NO_ROUTE.search(message) \
            or why in ("ConnectionError", "ConnectTimeout", "ReadTimeout"):
        add("cache.hf-online-on-offline-node", (m := _NO_ROUTE.search(message)) and m[0] or why,
            cause="no answer")
    return found
