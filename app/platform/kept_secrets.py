"""Random secrets kept in a file under VAR_DIR, for settings left unset: the
status page's session key and `make run`'s Flower password.

The first process that asks makes the secret and every other process on the
machine (the API server's workers, a restart) reads the same one, so a cookie signed by
one API process is good in the others and a saved Flower login survives restarts.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def kept_secret(path: Path, nbytes: int = 32) -> str:
    """The secret stored at `path` (mode 0600), made now if there is none.

    Written to a private temporary file and hard-linked into place, so two
    processes starting at once never read a half-written file: the link fails
    for the second, which then reads the first one's secret.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(nbytes) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"{path} is empty; delete it and a new secret is made")
    return secret
