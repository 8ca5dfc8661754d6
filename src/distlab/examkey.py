"""The exam's own state, signed: editing exam.json (its seeds, its deadline) reads as tampering.

``distlab exam`` writes the exam's seeds and deadline in DIR/exam.json, which the candidate's
account may be able to write. The file carries an HMAC-SHA256 of its content under a key of this
installation's, kept in ``$DISTLAB_EXAM_KEY`` or ``~/.config/distlab/exam-key`` (created 0600 in
a 0700 folder): a candidate who edits a seed or moves the deadline cannot sign the new content,
and ``submit`` grades every problem as tampered. The key and the exam's files are hidden from
the candidate's sealed code (runtime/seal/sandbox.py); an account that can read the key file
could sign, so run the exam under an account the candidate does not hold. The signed fields name
the exam's folder, so another exam's exam.json or results.json copied in reads as copied; and
the folders of every exam opened here are listed beside the key, so that each exam's graded code
is kept from the others (their work and graded files).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any


def key_path() -> Path:
    env = os.environ.get("DISTLAB_EXAM_KEY")
    return Path(env) if env else Path.home() / ".config" / "distlab" / "exam-key"


def _key() -> bytes:
    path = key_path()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        return path.read_bytes()


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in fields.items() if k != "signature"}, sort_keys=True).encode()


def sign(fields: dict[str, Any]) -> str:
    return hmac.new(_key(), _canonical(fields), hashlib.sha256).hexdigest()


def verify(fields: dict[str, Any]) -> bool:
    signature = fields.get("signature")
    return isinstance(signature, str) and hmac.compare_digest(signature, sign(fields))


def _opened_list() -> Path:
    return key_path().parent / "exams-opened"


def remember_exam(folder: Path) -> None:
    """Adds ``folder`` to the exams this installation opened (beside the key, the assessor's)."""
    listed = _opened_list()
    listed.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(listed, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(str(folder) + "\n")


def exams_opened() -> list[Path]:
    """The folders of the exams this installation opened that still exist."""
    try:
        lines = _opened_list().read_text().splitlines()
    except FileNotFoundError:
        return []
    return [Path(line) for line in dict.fromkeys(lines) if line and Path(line).is_dir()]
