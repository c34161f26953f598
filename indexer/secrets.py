"""What counts as a secret: file names on the deny list, and credentials found in a file's content.

Names are matched case-insensitively (`.ENV`, `ID_RSA` and `Server.PEM` are the same secrets on a
case-insensitive file system, and a renamed copy is no safer) against every component of a path
relative to the workspace root, so a denied directory (`.ssh`) denies all it holds; a few files
are secrets only in their place (`.docker/config.json`). The list follows what gitleaks,
detect-secrets and editor assistants' security ignore lists cover.

Content is checked for markers whose false-positive rate is near zero: PEM and OpenSSH private
key blocks and token formats with a fixed prefix and length (AWS, GitHub, GitLab, Slack, Google,
Stripe, npm, PyPI, OpenAI, Anthropic). A file that merely mentions "password" is not a secret.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re

DENY_PATTERNS = (
    # Environment files, and their copies (`prod.env`, `.env.local`, `secrets.env.bak`).
    ".env*",
    "*.env",
    "*.env.*",
    ".envrc",
    # Private keys and key stores, with backup or copy suffixes (`key.pem.txt`).
    "*.pem",
    "*.pem.*",
    "*.key",
    "*.key.*",
    "*.p8",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.bks",
    "*.keystore",
    "*.ppk",
    "*.kdbx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*_rsa",
    "*_dsa",
    "*_ecdsa",
    "*_ed25519",
    "ssh_host_*_key*",
    ".ssh",
    ".gnupg",
    "secring.*",
    # Credentials of tools and clouds.
    "credentials",
    "*_credentials",
    "*-credentials",
    "service-account*.json",
    "legacy_credentials",
    "access_tokens.db",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".my.cnf",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    ".gitcookies",
    ".dockercfg",
    "kubeconfig",
    "*.kubeconfig",
    ".s3cfg",
    ".boto",
    ".vault-token",
    ".terraformrc",
    "terraform.rc",
    "*.tfvars",
    "*.tfvars.json",
    "*.tfstate",
    "*.tfstate.*",
    ".htpasswd",
    "*.htpasswd",
    # Account databases of Unix systems (a copy of /etc in a workspace).
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd",
    "passwd-",
    "master.passwd",
)
"""Name patterns (shell globs, lower case) of secrets never indexed, whatever the ignore files
say. A directory that matches is not entered."""

DENY_EXCEPTIONS = (".env.example", ".env.sample", ".env.template", "*.env.example")
"""Templates name the variables without their values: they help completion, and the content
check still skips one that holds a real key."""

DENY_PATHS = (".docker/config.json", ".kube/config")
"""Files that are secrets only in their place: `config.json` elsewhere is ordinary."""

# "secret" or "credential" in the stem of a data or configuration file (`config/secrets.yaml`,
# `client_secret_123.json`, `aws_credentials`, `.secrets`), but not in source code: a module
# `credentials.py` or `secret_manager.go` is code that handles secrets, not a secret.
_SECRET_CONFIG = re.compile(
    r"\.?[^.]*(?:secret|credential)[^.]*"  # no extension
    r"|[^/]*(?:secret|credential)[^/]*"
    r"\.(?:json|ya?ml|toml|ini|cfg|conf|config|properties|env|txt|xml|csv|plist|bak|old)"
)

# One regex per list, matched against each path component: gitignore's name-only patterns mean
# exactly this, and one combined regex is several times faster than pattern after pattern.
_NAMES = re.compile("|".join(fnmatch.translate(p) for p in DENY_PATTERNS))
_EXCEPTIONS = re.compile("|".join(fnmatch.translate(p) for p in DENY_EXCEPTIONS))

# One regex per kind, tried only when one of its literals occurs: a `bytes in bytes` search is
# about ten times faster than one combined regex, so the whole file is checked (about 20 ms a
# megabyte, far below what chunking and embedding it costs) and not only its head.
_TOKEN_PATTERNS: tuple[tuple[str, tuple[bytes, ...], re.Pattern[bytes]], ...] = (
    (
        "private_key",
        (b"PRIVATE KEY",),
        # A header followed by base64 (after optional `Proc-Type:` lines): a parser's string
        # constant naming the header is not a key.
        re.compile(
            rb"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----\r?\n"
            rb"(?:[A-Za-z-]+:[^\n]*\r?\n|\r?\n){0,4}[A-Za-z0-9+/=]{40,}"
        ),
    ),
    ("putty_key", (b"PuTTY-User-Key-File-",), re.compile(rb"PuTTY-User-Key-File-\d: ")),
    # AWS's documentation example (`AKIAIOSFODNN7EXAMPLE`) is not a key.
    (
        "aws_access_key",
        (b"AKIA", b"ASIA", b"ABIA", b"ACCA"),
        re.compile(rb"\b(?:AKIA|ASIA|ABIA|ACCA)(?![A-Z0-9]{9}EXAMPLE)[A-Z0-9]{16}\b"),
    ),
    (
        "github_token",
        (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
        re.compile(rb"\bgh[pousr]_[A-Za-z0-9]{36}\b"),
    ),
    ("github_token", (b"github_pat_",), re.compile(rb"\bgithub_pat_[A-Za-z0-9_]{82}")),
    ("gitlab_token", (b"glpat-",), re.compile(rb"\bglpat-[A-Za-z0-9_-]{20}")),
    ("slack_token", (b"xox",), re.compile(rb"\bxox[abeoprs]-(?:[0-9]+-)+[A-Za-z0-9]{8,}")),
    (
        "slack_webhook",
        (b"hooks.slack.com",),
        re.compile(rb"hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,}"),
    ),
    ("google_api_key", (b"AIza",), re.compile(rb"\bAIza[0-9A-Za-z_-]{35}")),
    ("stripe_key", (b"_live_",), re.compile(rb"\b[rs]k_live_[0-9A-Za-z]{24,}")),
    ("npm_token", (b"npm_",), re.compile(rb"\bnpm_[A-Za-z0-9]{36}\b")),
    ("pypi_token", (b"pypi-",), re.compile(rb"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}")),
    (
        "openai_key",
        (b"T3BlbkFJ",),
        re.compile(rb"\bsk-[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}"),
    ),
    ("anthropic_key", (b"sk-ant-",), re.compile(rb"\bsk-ant-[a-z0-9]+-[A-Za-z0-9_-]{80,}")),
)

RULES_VERSION = hashlib.sha256(
    repr(
        (
            DENY_PATTERNS,
            DENY_EXCEPTIONS,
            DENY_PATHS,
            _SECRET_CONFIG.pattern,
            [p.pattern for *_, p in _TOKEN_PATTERNS],
        )
    ).encode()
).hexdigest()[:16]
"""Changes with the rules: an index built under other rules looks at every file again."""


def is_denied(rel_path: str, is_dir: bool = False) -> bool:
    """True when a path relative to the workspace root (or a bare name) is a secret by name.

    Any component may decide (`.ssh/config`); case is ignored.
    """
    path = rel_path.lower()
    parts = path.split("/")
    for part in parts:
        if _NAMES.match(part) is not None and _EXCEPTIONS.match(part) is None:
            return True
    if any(path == place or path.endswith("/" + place) for place in DENY_PATHS):
        return True
    return not is_dir and _SECRET_CONFIG.fullmatch(parts[-1]) is not None


def find_secret(data: bytes) -> str | None:
    """The kind of the first credential found in `data` (`private_key`, `aws_access_key`, ...),
    or None."""
    for kind, literals, pattern in _TOKEN_PATTERNS:
        if any(literal in data for literal in literals) and pattern.search(data) is not None:
            return kind
    return None
