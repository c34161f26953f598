"""Secrets stay out of the index: links that leave the workspace, the deny list applied to links'
targets and to near-miss names, and credentials found in a file's content.

Credentials are assembled at run time from harmless parts, so that no secret scanner mistakes
this file for a leak and no real key is ever written down.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from indexer.ignore import is_denied, is_excluded
from indexer.scan import FileStat, Scanner, StatCache, read_file
from indexer.secrets import is_denied_entry
from indexer.service import WorkspaceIndex
from indexer.watch import WorkspaceWatcher
from tests.indexer.test_scan import write

_RANDOM = random.Random(7)  # the same fake keys on every run


def _chars(alphabet: str, n: int) -> str:
    return "".join(_RANDOM.choice(alphabet) for _ in range(n))


UPPER_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def pem_block(label: str, headers: str = "") -> str:
    """A PEM block of random bytes under `label` (e.g. `RSA PRIVATE KEY`)."""
    body = base64.b64encode(_RANDOM.randbytes(288)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    dashes = "-" * 5
    head = [f"{dashes}BEGIN {label}{dashes}", *([headers] if headers else [])]
    return "\n".join([*head, *lines, f"{dashes}END {label}{dashes}", ""])


PRIVATE_KEY = pem_block("RSA PRIVATE KEY")
AWS_KEY_ID = "AKIA" + _chars(UPPER_DIGITS, 16)
GITHUB_TOKEN = "ghp" + "_" + _chars(ALNUM, 36)
# A marker that only a leaked file holds: search results and the database must never show it.
SHADOW_LINE = "root:$6$leakedhashLEAKEDHASH:19000:0:99999:7:::\n"


@pytest.mark.parametrize(
    ("name", "denied"),
    [
        pytest.param(".ENV", True, id="dotenv-upper"),
        pytest.param("ID_RSA", True, id="ssh-key-upper"),
        pytest.param("Server.PEM", True, id="pem-mixed-case"),
        pytest.param("secrets.env", True, id="named-env"),
        pytest.param("prod.env", True, id="prod-env"),
        pytest.param("key.pem.txt", True, id="pem-copy"),
        pytest.param("aws_credentials", True, id="aws-credentials"),
        pytest.param("config/secrets.yaml", True, id="secrets-yaml"),
        pytest.param("client_secret_1234.apps.json", True, id="oauth-client-secret"),
        pytest.param(".docker/config.json", True, id="docker-config"),
        pytest.param("home/.kube/config", True, id="kube-config"),
        pytest.param("terraform.tfvars", True, id="tfvars"),
        pytest.param("infra/terraform.tfstate.backup", True, id="tfstate"),
        pytest.param("etc/shadow", True, id="shadow"),
        pytest.param("etc/gshadow", True, id="gshadow"),
        pytest.param(".ssh/known_hosts", True, id="ssh-dir"),
        pytest.param("deploy/id_ed25519", True, id="ed25519"),
        pytest.param(".npmrc", True, id="npmrc"),
        pytest.param(".htpasswd", True, id="htpasswd"),
        pytest.param("cert.P12", True, id="p12-upper"),
        pytest.param(".env.example", False, id="env-example"),
        pytest.param(".env.sample", False, id="env-sample"),
        pytest.param(".env.template", False, id="env-template"),
        pytest.param("credentials.py", False, id="credentials-module"),
        pytest.param("secret_manager.go", False, id="secret-code"),
        pytest.param("password_reset.py", False, id="password-module"),
        pytest.param("config.json", False, id="plain-config"),
        pytest.param("docker/config.json", False, id="config-elsewhere"),
        pytest.param("keys.py", False, id="keys-module"),
        pytest.param("monkey.txt", False, id="key-substring"),
        pytest.param("environment.py", False, id="not-dotenv"),
        # File patterns name files, not the source directories that share their name.
        pytest.param("src/shadow/index.ts", False, id="dir-shadow"),
        pytest.param("openedx/core/djangoapps/credentials/models.py", False, id="dir-credentials"),
        pytest.param("src/passwd/main.c", False, id="dir-passwd"),
        pytest.param("lib/kubeconfig/loader.go", False, id="dir-kubeconfig"),
        pytest.param("tests/fixtures/credentials/x.py", False, id="dir-credentials-fixtures"),
        pytest.param("crypto/test_rsa/vectors.go", False, id="dir-rsa-suffix"),
        # Directory patterns deny all they hold, at any depth.
        pytest.param("home/.aws/config", True, id="aws-dir"),
        pytest.param("deploy/.gnupg/pubring.kbx", True, id="gnupg-dir"),
        pytest.param("infra/.terraform/terraform.tfstate", True, id="terraform-dir"),
        pytest.param("infra/terraform.tfstate.d/prod/notes.txt", True, id="tf-workspaces"),
        pytest.param("home/.aws/credentials", True, id="aws-credentials-file"),
        # `*.env.*` and `*.key.*` deny copies, not source files named after what they handle.
        pytest.param("config.env.ts", False, id="env-ts"),
        pytest.param("vite.env.d.ts", False, id="env-dts"),
        pytest.param("src/app.key.ts", False, id="key-ts"),
        pytest.param("api.key.test.ts", False, id="key-test-ts"),
        pytest.param("secrets.env.bak", True, id="env-copy"),
        pytest.param("prod.env.yaml", True, id="env-yaml"),
        pytest.param("deploy.env.sh", True, id="env-shell"),
        pytest.param("tls.key.old", True, id="key-copy"),
        pytest.param(".env.local.ts", True, id="dotenv-ts"),
    ],
)
def test_deny_list_is_case_insensitive_and_covers_near_misses(name: str, denied: bool) -> None:
    assert is_denied(name) is denied
    if "/" in name:
        # The walk checks only an entry's own name once its directories passed: it agrees.
        parent, _, base = name.rpartition("/")
        dirs = parent.split("/")
        if not any(is_denied("/".join(dirs[: i + 1]), True) for i in range(len(dirs))):
            assert is_denied_entry(parent, base, False) is denied


@pytest.mark.parametrize(
    ("name", "denied"),
    [
        pytest.param(".ssh", True, id="ssh"),
        pytest.param("Home/.AWS", True, id="aws-upper"),
        pytest.param("credentials", False, id="credentials"),
        pytest.param("src/shadow", False, id="shadow"),
        pytest.param("lib/kubeconfig", False, id="kubeconfig"),
        pytest.param("crypto/test_rsa", False, id="rsa-suffix"),
    ],
)
def test_directories_are_denied_by_directory_patterns_only(name: str, denied: bool) -> None:
    assert is_denied(name, is_dir=True) is denied


def test_scan_indexes_source_directories_named_like_secrets(tmp_path: Path) -> None:
    legit = [
        "src/shadow/index.ts",
        "openedx/core/djangoapps/credentials/models.py",
        "src/passwd/main.c",
        "lib/kubeconfig/loader.go",
        "crypto/test_rsa/vectors.go",
        "vite.env.d.ts",
        "src/app.key.ts",
    ]
    secrets = ["lib/kubeconfig/kubeconfig", "src/shadow/shadow", ".aws/credentials", "a.key.old"]
    for rel in legit + secrets:
        write(tmp_path, rel, "TOKEN = 'value'\n")
    result = Scanner(tmp_path).scan(StatCache())
    assert set(result.changed) == set(legit)
    assert result.denied == len(secrets)
    for rel in legit:
        assert not is_excluded(tmp_path, rel), rel


def test_scan_skips_near_miss_names(tmp_path: Path) -> None:
    secrets = [
        ".ENV",
        "ID_RSA",
        "Server.PEM",
        "secrets.env",
        "prod.env",
        "key.pem.txt",
        "aws_credentials",
        "config/secrets.yaml",
        ".docker/config.json",
        "terraform.tfvars",
    ]
    legit = ["app.py", "config/settings.py", ".env.example", "docker/config.json"]
    for rel in secrets + legit:
        write(tmp_path, rel, "TOKEN = 'value'\n")
    result = Scanner(tmp_path).scan(StatCache())
    assert set(result.changed) == set(legit)
    assert result.denied == len(secrets)


def _outside(tmp_path: Path) -> Path:
    """Files outside the workspace (`tmp_path/ws`): an /etc-like directory and a home."""
    outside = tmp_path / "outside"
    write(outside, "etc/shadow", SHADOW_LINE)
    write(outside, "etc/gshadow", SHADOW_LINE)
    write(outside, "etc/hosts", "127.0.0.1 localhost\n")
    write(outside, "home/.ssh/id_rsa", PRIVATE_KEY)
    write(outside, "home/project_notes.md", "# notes\n")
    return outside


LinkCase = Callable[[Path, Path], None]
"""Makes links in the workspace (first argument) to the workspace or to `outside` (second)."""


@pytest.mark.parametrize(
    ("make_links", "link_paths", "indexed"),
    [
        pytest.param(
            lambda ws, out: os.symlink(out / "etc", ws / "etc_link"),
            ["etc_link/shadow", "etc_link/gshadow", "etc_link/hosts"],
            set(),
            id="dir-outside",
        ),
        pytest.param(
            lambda ws, out: os.symlink(out / "home/.ssh/id_rsa", ws / "notes.txt"),
            ["notes.txt"],
            set(),
            id="secret-file-outside",
        ),
        pytest.param(
            lambda ws, out: os.symlink(out / "home/project_notes.md", ws / "notes.md"),
            ["notes.md"],
            set(),
            id="plain-file-outside",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws.parent, ws / "up"),
            ["up/outside/etc/hosts"],
            set(),
            id="parent-of-workspace",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / ".env", ws / "settings_copy.py"),
            ["settings_copy.py"],
            set(),
            id="to-dotenv-inside",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / ".docker", ws / "dlink"),
            ["dlink/config.json"],
            set(),
            id="dir-to-denied-place",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / ".git/config", ws / "git_config.ini"),
            ["git_config.ini"],
            set(),
            id="into-dot-git",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / "private", ws / "docs"),
            ["docs/prod.py"],
            set(),
            id="dir-to-ignored-dir",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / "private/prod.py", ws / "prod_alias.py"),
            ["prod_alias.py"],
            set(),
            id="file-to-ignored-file",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / "build/out.py", ws / "out_alias.py"),
            ["out_alias.py"],
            set(),
            id="file-to-ignored-pattern",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / "src", ws / "src_link"),
            ["src_link/app.py"],
            {"src_link/app.py"},
            id="dir-inside-followed",
        ),
        pytest.param(
            lambda ws, out: os.symlink(ws / "src/app.py", ws / "alias.py"),
            ["alias.py"],
            {"alias.py"},
            id="file-inside-followed",
        ),
    ],
)
def test_links_are_followed_only_inside_and_judged_by_target(
    tmp_path: Path, make_links: LinkCase, link_paths: list[str], indexed: set[str]
) -> None:
    outside = _outside(tmp_path)
    ws = tmp_path / "ws"
    write(ws, "src/app.py", "def main():\n    return 1\n")
    write(ws, ".env", "API_TOKEN=abc\n")
    write(ws, ".docker/config.json", '{"auths": {}}\n')
    write(ws, ".git/config", "[core]\n")
    write(ws, ".gitignore", "private/\nbuild/out.py\n")
    write(ws, "private/prod.py", "DSN = 'postgres://prod'\n")
    write(ws, "build/out.py", "x = 1\n")
    make_links(ws, outside)
    found = set(Scanner(ws).scan(StatCache()).changed)
    assert found - {"src/app.py", ".gitignore"} == indexed
    # The single-path check (the watcher's and the editor's) agrees with the walk.
    for rel in link_paths:
        assert is_excluded(ws, rel) is (rel not in indexed), rel


def test_outside_links_are_logged_once_per_walk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = _outside(tmp_path)
    ws = tmp_path / "ws"
    write(ws, "app.py")
    os.symlink(outside / "etc", ws / "etc_link")
    os.symlink(outside / "home/.ssh/id_rsa", ws / "notes.txt")
    os.symlink(outside / "home", ws / "pkg_home")
    with caplog.at_level(logging.INFO, logger="indexer.scan"):
        result = Scanner(ws).scan(StatCache())
    assert result.changed == ["app.py"]
    assert result.links_outside == 3
    messages = [r.getMessage() for r in caplog.records if "outside the workspace" in r.message]
    assert len(messages) == 1, messages
    assert messages[0].startswith("not following 3 link(s)")


def test_links_are_not_followed_when_disabled(tmp_path: Path) -> None:
    write(tmp_path, "src/app.py")
    os.symlink(tmp_path / "src/app.py", tmp_path / "alias.py")
    assert Scanner(tmp_path, follow_symlinks=False).scan(StatCache()).changed == ["src/app.py"]
    assert is_excluded(tmp_path, "alias.py", follow_symlinks=False)


def _indented_key(label: str) -> str:
    """A key in a YAML or Helm block scalar: every line indented."""
    lines = pem_block(label).splitlines()
    return "tls:\n  key: |\n" + "".join(f"    {line}\n" for line in lines)


def _service_account_json() -> str:
    """A GCP service-account file: the key's line breaks escaped as `\\n`."""
    fields = {"type": "service_account", "private_key": pem_block("PRIVATE KEY")}
    return json.dumps(fields, indent=2) + "\n"


def _string_literals(label: str, joiner: str = "") -> str:
    """A key built from Python string literals, one line each, with escaped line breaks."""
    lines = pem_block(label).splitlines()
    parts = [f'    "{line}\\n"' for line in lines]
    return "KEY = (\n" + f"{joiner}\n".join(parts) + "\n)\n"


def _header_template() -> str:
    """A template that names the header and footer around a placeholder: no key."""
    dashes = "-" * 5
    begin, end = f"{dashes}BEGIN PRIVATE KEY{dashes}", f"{dashes}END PRIVATE KEY{dashes}"
    return f'PEM = "{begin}\\n{{body}}\\n{end}\\n"\n'


def _aws_example_key() -> str:
    return "AKIA" + "IOSFODNN7" + "EXAMPLE"  # AWS's documented example id


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        pytest.param(PRIVATE_KEY, True, id="rsa-pem"),
        pytest.param(pem_block("PRIVATE KEY"), True, id="pkcs8-pem"),
        pytest.param(pem_block("EC PRIVATE KEY"), True, id="ec-pem"),
        pytest.param(pem_block("OPENSSH PRIVATE KEY"), True, id="openssh"),
        pytest.param(
            pem_block("RSA PRIVATE KEY", "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00FF\n"),
            True,
            id="encrypted-pem",
        ),
        pytest.param(
            pem_block("PGP PRIVATE KEY BLOCK", "Version: GnuPG v2\n"), True, id="pgp-private"
        ),
        pytest.param("# deploy key\n" * 3 + PRIVATE_KEY, True, id="pem-after-comments"),
        pytest.param(_indented_key("RSA PRIVATE KEY"), True, id="yaml-indented"),
        pytest.param(_indented_key("OPENSSH PRIVATE KEY"), True, id="yaml-indented-openssh"),
        pytest.param(_service_account_json(), True, id="json-escaped"),
        pytest.param(_string_literals("RSA PRIVATE KEY"), True, id="python-literals"),
        pytest.param(_string_literals("EC PRIVATE KEY", " +"), True, id="literals-concatenated"),
        pytest.param(
            PRIVATE_KEY.replace("\n", "\r\n").replace("\r\n", "\\r\\n"),
            True,
            id="escaped-crlf",
        ),
        pytest.param(
            "KEY=" + " ".join(PRIVATE_KEY.splitlines()) + "\n", True, id="space-separated"
        ),
        pytest.param(f'AWS_ACCESS_KEY_ID = "{AWS_KEY_ID}"\n', True, id="aws-key-id"),
        pytest.param(f"token: {GITHUB_TOKEN}\n", True, id="github-classic"),
        pytest.param(f"GH={'github_pat_' + _chars(ALNUM + '_', 82)}\n", True, id="github-pat"),
        pytest.param(
            f"SLACK={'xoxb' + '-1234567890-1234567890123-' + _chars(ALNUM, 24)}\n",
            True,
            id="slack-bot",
        ),
        pytest.param("x = 1\n" * 4000 + f"KEY = '{AWS_KEY_ID}'\n", True, id="deep-in-file"),
        pytest.param(pem_block("PUBLIC KEY"), False, id="public-key"),
        pytest.param(pem_block("CERTIFICATE"), False, id="certificate"),
        pytest.param(
            'HEADER = "-----BEGIN RSA PRIVATE KEY-----"\nif line == HEADER:\n    parse()\n',
            False,
            id="parser-constant",
        ),
        pytest.param(
            'headers:\n  begin: "-----BEGIN RSA PRIVATE KEY-----"\n  end: "-----END RSA"\n',
            False,
            id="yaml-header-constant",
        ),
        pytest.param(_header_template(), False, id="escaped-header-template"),
        pytest.param(
            json.dumps({"marker": "-----BEGIN PRIVATE KEY-----\n"}) + "\n",
            False,
            id="json-header-constant",
        ),
        pytest.param(_indented_key("PUBLIC KEY"), False, id="yaml-indented-public"),
        pytest.param(f'EXAMPLE_ID = "{_aws_example_key()}"\n', False, id="aws-doc-example"),
        pytest.param('SLACK_TOKEN = "xoxb-your-token-here"\n', False, id="slack-placeholder"),
        pytest.param(
            "def check(password: str) -> bool:\n    return len(password) > 12  # password\n",
            False,
            id="mentions-password",
        ),
        pytest.param("ssh-ed25519 " + _chars(ALNUM, 68) + " me@host\n", False, id="ssh-public"),
    ],
)
def test_content_with_credentials_is_skipped(tmp_path: Path, text: str, secret: bool) -> None:
    write(tmp_path, "settings.py", text)
    content = read_file(tmp_path, "settings.py", 1_000_000)
    assert content.stat.skip == ("secret" if secret else "")
    assert (content.data is None) is secret
    assert (content.stat.digest is None) is secret


def test_index_built_under_older_rules_reads_every_file_again(tmp_path: Path) -> None:
    write(tmp_path, "config.py", f"KEY = '{AWS_KEY_ID}'\n")
    st = os.stat(tmp_path / "config.py")
    # What an index built before content checks holds: the file, trusted and indexed.
    cache = StatCache(
        files={"config.py": FileStat(st.st_mtime_ns, st.st_size, st.st_ino, b"\x01" * 32)},
        fingerprint="((), True, (0, -1))",
    )
    assert Scanner(tmp_path).scan(cache).changed == ["config.py"]


def test_watcher_does_not_queue_denied_paths(tmp_path: Path) -> None:
    delivered: list[str] = []
    app_delivered = threading.Event()

    def deliver(paths: list[str]) -> None:
        delivered.extend(paths)
        if "app.py" in paths:
            app_delivered.set()

    watcher = WorkspaceWatcher(tmp_path, 0.01, deliver, lambda: None)
    try:
        # app.py last: a denied path queued before it would be due first, so it would be
        # delivered with app.py or before it.
        for rel in [".ENV", "deploy/Server.PEM", "config/secrets.yaml", "app.py"]:
            watcher.observe(str(tmp_path / rel), False)
        assert app_delivered.wait(30)
    finally:
        watcher.debouncer.close()
    assert delivered == ["app.py"]


def test_search_never_returns_secrets(
    tmp_path: Path, open_index: Callable[..., WorkspaceIndex], cache_dir: Path
) -> None:
    outside = _outside(tmp_path)
    ws = tmp_path / "ws"
    write(ws, "app.py", "def handler(request):\n    return login(request.user, request.password)\n")
    write(ws, ".env", "API_TOKEN=leakedhash\n")
    write(ws, ".ENV", "API_TOKEN=leakedhash\n")
    write(ws, "config/settings.py", f"AWS_ACCESS_KEY_ID = '{AWS_KEY_ID}'  # leakedhash\n")
    write(ws, "deploy/key.pem.txt", PRIVATE_KEY)
    os.symlink(outside / "etc", ws / "etc_link")
    os.symlink(outside / "home/.ssh/id_rsa", ws / "notes.txt")
    os.symlink(ws / ".env", ws / "settings_copy.py")
    index = open_index(ws)
    markers = ["leakedhash", AWS_KEY_ID, PRIVATE_KEY.splitlines()[1]]
    for query in ["root shadow password hash", "API token leakedhash", "AWS access key id", "RSA"]:
        for hit in index.search(query, k=20):
            assert hit.path == "app.py", hit
            assert not any(marker in hit.preview for marker in markers)
    stats = index.last_stats
    assert stats is not None
    assert stats.links_outside == 2
    assert stats.files_skipped == {"secret": 1}
    assert stats.files_denied == 4  # .env, .ENV, key.pem.txt, settings_copy.py
    # The editor's view follows the same rules: a buffer with a key, a link leaving the tree.
    index.update_document(ws / "config/settings.py", f"KEY = '{GITHUB_TOKEN}'\n")
    index.update_document(ws / "notes.txt", None)
    index.update_document(ws / "etc_link/shadow", None)
    assert index.wait_idle(60)
    assert {hit.path for hit in index.search("KEY token shadow", k=20)} <= {"app.py"}
    index.close()
    for path in cache_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for marker in [*markers, GITHUB_TOKEN]:
                assert marker.encode() not in data, (path, marker)
