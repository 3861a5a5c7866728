"""A small Hugging Face Hub on 127.0.0.1 for tests, and the bert-squad repositories it serves.

It implements exactly what huggingface_hub 2.4's ``snapshot_download`` / ``hf_hub_download``
(and ``HfApi.repo_info``) ask a Hub for, over plain HTTP (no Xet headers, so no Xet):

- ``GET /api/{models|datasets}/{repo}/revision/{rev}``: repo info (``id``, ``sha``,
  ``siblings``); 404 with ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound``;
- ``GET /api/{models|datasets}/{repo}/tree/{rev}[/{path}]?recursive=...``: the file and
  folder listing (``type``, ``oid``, ``size``, ``path``, ``lfs``), one page;
- ``GET /api/agent-harnesses``: the (empty) registry huggingface_hub 2.4 asks for once a
  day when it builds its User-Agent (unless HF_HUB_DISABLE_TELEMETRY=1);
- ``HEAD``/``GET /[datasets/]{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit``,
  ``ETag`` (git blob sha1, or the sha256 for LFS files with ``X-Linked-Etag``/``X-Linked-Size``
  as the Hub sends them), ``Content-Length``, ``Accept-Ranges`` and ``Range`` (206);
  404 with ``X-Error-Code: EntryNotFound`` and the commit.

Revisions: ``branches`` (default ``main``) or the repository's commit sha (a fixed fake
40-hex per repository).
Every request is recorded (``server.requests``) so a test can assert that nothing was asked.

    with HubServer(bert_squad_repos(tmp)) as hub:
        env["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

BERT_REPO = "google-bert/bert-base-uncased"
SQUAD_REPO = "rajpurkar/squad"
LFS_SUFFIXES = (".safetensors", ".parquet", ".bin", ".arrow", ".model")
SECRET = "secret-value"  # the HF_TOKEN of every client environment: no output may show it
# what would make a client skip the hub or look elsewhere
CLEARED = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE",
           "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "XDG_CACHE_HOME",
           "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")

Repos = dict[tuple[str, str], dict[str, bytes]]  # (kind, repo) -> {path: content}


def hub_env(home: Path, endpoint: str, **extra: str) -> dict:
    """This process's environment with a fresh HF_HOME, the endpoint and the secret token."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_TOKEN=SECRET, **extra)
    return env


def fake_commit(kind: str, repo: str) -> str:
    """The fixed commit sha served for a repository."""
    return hashlib.sha1(f"dsenv-test {kind} {repo}".encode()).hexdigest()


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def etag_of(path: str, content: bytes) -> str:
    """What the Hub sends as the file's ETag: sha256 for LFS files, else the git blob sha1."""
    return hashlib.sha256(content).hexdigest() if is_lfs(path) else git_blob_sha1(content)


class HubServer:
    """A threaded HTTP server on 127.0.0.1 (port 0) serving ``repos``; a context manager."""

    def __init__(self, repos: Repos, branches: tuple[str, ...] = ("main",)):
        self.repos = {key: dict(files) for key, files in repos.items()}
        self.branches = tuple(branches)  # revisions besides the commit sha
        self.commits = {key: fake_commit(*key) for key in self.repos}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.authorization: list[str] = []  # Authorization headers seen
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def commit(self, kind: str, repo: str) -> str:
        return self.commits[(kind, repo)]

    def record(self, method: str, path: str, authorization: str | None) -> None:
        with self._lock:
            self.requests.append((method, path))
            if authorization:
                self.authorization.append(authorization)

    def downloads(self) -> list[str]:
        """Paths of the GET requests for file contents."""
        with self._lock:
            return [p for m, p in self.requests if m == "GET" and "/resolve/" in p]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.authorization.clear()

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="fake-hub")
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------------------- handler
_API = re.compile(r"^/api/(?P<kinds>models|datasets)/(?P<rest>.+)$")
_RESOLVE = re.compile(r"^/(?:(?P<datasets>datasets)/)?(?P<repo>[^/]+(?:/[^/]+)?)/resolve/"
                      r"(?P<rev>[^/]+)/(?P<path>.+)$")


def _make_handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        # ------------------------------------------------------------------ plumbing
        def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
                  content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)

        def _json(self, data, status: int = 200, headers: dict | None = None) -> None:
            self._send(status, json.dumps(data).encode(), headers)

        def _error(self, status: int, code: str, message: str, headers: dict | None = None):
            self._json({"error": message}, status,
                       {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})})

        def _repo(self, kind: str, repo: str, rev: str):
            """(files, commit) or None after sending the 404."""
            key = (kind, repo)
            if key not in hub.repos:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            commit = hub.commits[key]
            if rev not in (*hub.branches, commit):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return hub.repos[key], commit

        # ------------------------------------------------------------------ verbs
        def do_GET(self) -> None:
            self._dispatch()

        def do_HEAD(self) -> None:
            self._dispatch()

        def _dispatch(self) -> None:
            split = urlsplit(self.path)
            path = split.path
            hub.record(self.command, self.path, self.headers.get("Authorization"))
            if path == "/api/agent-harnesses" and self.command == "GET":
                return self._json({"standardEnvVars": [], "harnesses": {}})
            if (match := _API.match(path)) and self.command == "GET":
                kind = match["kinds"][:-1]
                return self._api(kind, match["rest"], parse_qs(split.query))
            if match := _RESOLVE.match(path):
                kind = "dataset" if match["datasets"] else "model"
                return self._resolve(kind, unquote(match["repo"]), unquote(match["rev"]),
                                     unquote(match["path"]))
            self._error(404, "NotFound", f"no route for {self.command} {path}")

        def _api(self, kind: str, rest: str, query: dict) -> None:
            parts = rest.split("/")
            # owner/name/<verb>/... or name/<verb>/...
            for size in (2, 1):
                if len(parts) > size and parts[size] in ("revision", "tree"):
                    repo, verb, tail = "/".join(parts[:size]), parts[size], parts[size + 1:]
                    break
            else:
                return self._error(404, "NotFound", f"no route for {rest}")
            if not tail:
                return self._error(404, "NotFound", "no revision")
            found = self._repo(kind, repo, unquote(tail[0]))
            if found is None:
                return None
            files, commit = found
            if verb == "revision":
                return self._json({
                    "id": repo, "sha": commit, "private": False, "disabled": False,
                    "lastModified": "2024-01-01T00:00:00.000Z", "tags": [],
                    "siblings": [{"rfilename": p} for p in sorted(files)],
                })
            below = unquote("/".join(tail[1:])).strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            return self._json(_tree(files, below, recursive))

        def _resolve(self, kind: str, repo: str, rev: str, path: str) -> None:
            found = self._repo(kind, repo, rev)
            if found is None:
                return None
            files, commit = found
            if path not in files:
                return self._error(404, "EntryNotFound", f"{path} does not exist",
                                   {"X-Repo-Commit": commit})
            content = files[path]
            etag = etag_of(path, content)
            headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if is_lfs(path):
                headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(content))}
            status, body = 200, content
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if ranged and self.command == "GET":
                start = int(ranged[1])
                end = int(ranged[2]) if ranged[2] else len(content) - 1
                if start >= len(content):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"})
                body = content[start:end + 1]
                headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(content)}"
                status = 206
            headers["Content-Length"] = str(len(body))
            self._send(status, body, headers, "application/octet-stream")

    return Handler


def _tree(files: dict[str, bytes], below: str, recursive: bool) -> list[dict]:
    """The /tree listing: files and folders under ``below`` (recursively or one level)."""
    prefix = f"{below}/" if below else ""
    entries: dict[str, dict] = {}
    for path in sorted(files):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):].split("/")
        for depth in range(1, len(rest)):  # the folders on the way
            folder = prefix + "/".join(rest[:depth])
            if recursive or depth == 1:
                entries.setdefault(folder, {"type": "directory", "path": folder,
                                            "oid": hashlib.sha1(folder.encode()).hexdigest()})
        if recursive or len(rest) == 1:
            content = files[path]
            entry = {"type": "file", "path": path, "size": len(content)}
            if is_lfs(path):
                sha = hashlib.sha256(content).hexdigest()
                pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\n"
                           f"size {len(content)}\n").encode()
                entry |= {"oid": git_blob_sha1(pointer),
                          "lfs": {"oid": sha, "size": len(content), "pointerSize": len(pointer)}}
            else:
                entry["oid"] = git_blob_sha1(content)
            entries[path] = entry
    return list(entries.values())


# ----------------------------------------------------------------------------- content
SUBJECTS = ["Alder", "Brook", "Cedar", "Dover", "Elm", "Fenwick", "Garnet", "Harlow",
            "Ives", "Juniper", "Kestrel", "Linden", "Marlow", "Norwood"]
FACTS = [  # (question template, context template, answer pool)
    ("What colour is the flag of {s}?", "The flag of {s} is {a} with a white border.",
     ["red", "green", "blue", "yellow", "purple", "orange"]),
    ("Which river flows through {s}?", "{s} lies on the banks of the {a} river, which floods "
     "every spring.", ["Tamsin", "Orrin", "Velda", "Maren", "Quill", "Sable"]),
    ("Who founded {s}?", "Historians agree that {s} was founded by {a} in the old days.",
     ["Ada Brant", "Milo Crane", "Tess Varga", "Oren Dahl", "Lina Ferro", "Ravi Sen"]),
    ("How many bridges does {s} have?", "Visitors often count the bridges of {s}: there are "
     "{a} of them.", ["three", "seven", "twelve", "nineteen", "forty", "two"]),
]


def squad_rows(count: int, seed: int, prefix: str) -> list[dict]:
    """SQuAD v1.1-shaped rows; answer_start points at the answer inside the context."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        subject = rng.choice(SUBJECTS)
        facts = rng.sample(FACTS, 2)
        answers = [rng.choice(pool) for _, _, pool in facts]
        context = " ".join(ctx.format(s=subject, a=a) for (_, ctx, _), a in
                           zip(facts, answers, strict=True))
        asked = rng.randrange(2)
        question = facts[asked][0].format(s=subject)
        answer = answers[asked]
        sentence = facts[asked][1].format(s=subject, a=answer)
        start = context.index(sentence) + sentence.index(answer)
        assert context[start:start + len(answer)] == answer
        rows.append({"id": hashlib.md5(f"{prefix}{index}".encode()).hexdigest()[:24],
                     "title": subject, "context": context, "question": question,
                     "answers": {"text": [answer], "answer_start": [start]}})
    return rows


# rajpurkar/squad's features, as its parquet files carry them (schema metadata "huggingface")
SQUAD_FEATURES = {
    "id": {"dtype": "string", "_type": "Value"},
    "title": {"dtype": "string", "_type": "Value"},
    "context": {"dtype": "string", "_type": "Value"},
    "question": {"dtype": "string", "_type": "Value"},
    "answers": {"feature": {"text": {"dtype": "string", "_type": "Value"},
                            "answer_start": {"dtype": "int32", "_type": "Value"}},
                "_type": "Sequence"},
}


def squad_parquet(rows: list[dict]) -> bytes:
    """The rows as rajpurkar/squad's plain_text parquet files have them."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("id", pa.string()), ("title", pa.string()), ("context", pa.string()),
        ("question", pa.string()),
        ("answers", pa.struct([("text", pa.list_(pa.string())),
                               ("answer_start", pa.list_(pa.int32()))])),
    ], metadata={"huggingface": json.dumps({"info": {"features": SQUAD_FEATURES}})})
    table = pa.Table.from_pylist(rows, schema=schema)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def bert_squad_repos(tmp_dir: Path, train_rows: int = 40, validation_rows: int = 12,
                     plant: str = "") -> Repos:
    """bert-squad's two repositories, built for real: a tiny BertForQuestionAnswering
    (hidden 32, 2 layers, 2 heads) with a WordPiece tokenizer trained here, under
    google-bert/bert-base-uncased; SQuAD-v1.1-shaped parquet files under rajpurkar/squad.
    ``plant``: a text appended to every validation paragraph (after its answer), as a
    hostile data set would carry it."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

    tmp_dir = Path(tmp_dir)
    train = squad_rows(train_rows, 1, "train")
    validation = squad_rows(validation_rows, 2, "validation")
    for row in validation if plant else ():
        row["context"] += f" {plant}"

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=400, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    wordpiece.train_from_iterator([r["context"] for r in train] + [r["question"] for r in train],
                                  trainer)
    vocab = wordpiece.get_vocab()
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=128)

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    model_dir = tmp_dir / "bert-base-uncased"
    BertForQuestionAnswering(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    # transformers 5 writes tokenizer.json only; the Hub repository also has vocab.txt
    ordered = sorted(vocab, key=vocab.__getitem__)
    (model_dir / "vocab.txt").write_text("".join(f"{token}\n" for token in ordered))
    model_files = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}
    model_files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    model_files["README.md"] = b"# tiny BERT for dsenv tests\n"

    squad_files = {
        "plain_text/train-00000-of-00001.parquet": squad_parquet(train),
        "plain_text/validation-00000-of-00001.parquet": squad_parquet(validation),
        "README.md": b"---\nconfigs:\n- config_name: plain_text\n---\n# SQuAD (test copy)\n",
        ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n",
    }
    return {("model", BERT_REPO): model_files, ("dataset", SQUAD_REPO): squad_files}


# ----------------------------------------------------------------------------- more workloads
T5_REPO, XSUM_REPO = "google-t5/t5-small", "EdinburghNLP/xsum"
XSUM_REVISION = "refs/convert/parquet"  # where the Hub keeps XSum's parquet conversion
GPT2_REPO, WIKITEXT_REPO = "distilbert/distilgpt2", "Salesforce/wikitext"
GLUE_REPO = "nyu-mll/glue"


def layout_parquet(rows: list[dict], layout: str) -> bytes:
    """Rows as a parquet file with the real data set's features in its "huggingface"
    schema metadata (what the Hub's files carry, e.g. MRPC's label ClassLabel)."""
    import io

    import datasets

    from dsenv.workloads import synthetic

    buffer = io.BytesIO()
    datasets.Dataset.from_list(rows, features=synthetic.features(layout)).to_parquet(buffer)
    return buffer.getvalue()


def _model_files(folder: Path, readme: str) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    files["README.md"] = readme.encode()
    return files


def t5_xsum_repos(tmp_dir: Path, train_rows: int = 48, validation_rows: int = 12) -> Repos:
    """t5-xsum's repositories: a tiny T5ForConditionalGeneration (d_model 32, one layer each
    side) with a Unigram tokenizer estimated here, under google-t5/t5-small (its
    tokenizer.json is the tokenizer; spiece.model is a placeholder, since transformers reads
    tokenizer.json when both are there); XSum-layout parquet files under EdinburghNLP/xsum
    at refs/convert/parquet."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from dsenv.workloads import synthetic, tiny

    splits = {"train": synthetic.xsum_rows(train_rows, 21),
              "validation": synthetic.xsum_rows(validation_rows, 22),
              "test": synthetic.xsum_rows(validation_rows, 23)}
    tokenizer = tiny.train_unigram(["summarize: " + r["document"] for r in splits["train"]]
                                   + [r["summary"] for r in splits["train"]], 400)
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(tokenizer) + 100, d_model=32, d_ff=64, d_kv=16,
                      num_heads=2, num_layers=1, decoder_start_token_id=0)
    folder = Path(tmp_dir) / "t5-small"
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "tokenizer_config.json").unlink()  # the Hub repository has none
    (folder / "spiece.model").write_bytes(b"placeholder: tokenizer.json is the tokenizer\n")
    xsum = {f"default/{split}/0000.parquet": layout_parquet(rows, "xsum")
            for split, rows in splits.items()}
    xsum[".gitattributes"] = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
    return {("model", T5_REPO): _model_files(folder, "# tiny T5 for dsenv tests\n"),
            ("dataset", XSUM_REPO): xsum}


def gpt2_wikitext_repos(tmp_dir: Path, articles: int = 30) -> Repos:
    """gpt2-wikitext's repositories: a tiny GPT2LMHeadModel (n_embd 32, 128 positions) with
    a byte-level BPE tokenizer trained here (vocab.json and merges.txt written as the Hub
    repository has them), under distilbert/distilgpt2; wikitext-layout parquet files under
    Salesforce/wikitext, config wikitext-2-raw-v1."""
    import json

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from dsenv.workloads import synthetic, tiny

    splits = {"train": synthetic.wikitext_rows(articles, 31),
              "validation": synthetic.wikitext_rows(max(articles // 5, 4), 32),
              "test": synthetic.wikitext_rows(max(articles // 5, 4), 33)}
    tokenizer = tiny.train_byte_bpe([r["text"] for r in splits["train"]], 400)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=1,
                        n_head=2, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    folder = Path(tmp_dir) / "distilgpt2"
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "tokenizer_config.json").unlink()
    bpe = json.loads((folder / "tokenizer.json").read_text())["model"]
    (folder / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    wikitext = {f"wikitext-2-raw-v1/{split}-00000-of-00001.parquet":
                layout_parquet(rows, "wikitext") for split, rows in splits.items()}
    wikitext[".gitattributes"] = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
    return {("model", GPT2_REPO): _model_files(folder, "# tiny GPT-2 for dsenv tests\n"),
            ("dataset", WIKITEXT_REPO): wikitext}


def bert_mrpc_repos(tmp_dir: Path, train_rows: int = 64, validation_rows: int = 24) -> Repos:
    """bert-mrpc's repositories: bert-squad's tiny BERT under google-bert/bert-base-uncased
    (its question-answering head is dropped, a classification head made, as with the real
    checkpoint); MRPC-layout parquet files (label a ClassLabel) under nyu-mll/glue, config
    mrpc, the test split's labels hidden (-1) as GLUE has them."""
    from dsenv.workloads import synthetic

    bert = bert_squad_repos(tmp_dir)[("model", BERT_REPO)]
    splits = {"train": synthetic.mrpc_rows(train_rows, 41),
              "validation": synthetic.mrpc_rows(validation_rows, 42),
              "test": synthetic.mrpc_rows(validation_rows, 43, labelled=False)}
    glue = {f"mrpc/{split}-00000-of-00001.parquet": layout_parquet(rows, "mrpc")
            for split, rows in splits.items()}
    glue[".gitattributes"] = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
    return {("model", BERT_REPO): bert, ("dataset", GLUE_REPO): glue}
