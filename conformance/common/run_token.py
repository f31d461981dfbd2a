"""The run token: what makes one strong enough, how to make one, and which token files are refused.

The token signs a run across nodes (``conformance/nodes/``).  Whoever reads node 0's store sees a
fresh challenge and each node's HMAC answer to it: with those, a token can be tested offline at
millions of guesses a second, so nothing but the token's own entropy stands between an eavesdropper
and a forged pass.  Hence the one rule, stated here and nowhere else:

    a run token must carry at least 128 bits, estimated as its length times log2 of the size of the
    character classes it uses (a-z: 26, A-Z: 26, 0-9: 10, anything else: 33, the other printable
    ASCII characters), and hold at least 8 different characters.

128 bits: NIST SP 800-57 Part 1 Rev. 5, Table 2, gives 128-bit security strength as acceptable
beyond 2031: a brute force of 2^128 HMACs is out of reach.  The estimate is an upper bound for a
token a person chose (a word repeated is still refused by the second clause, a phrase may slip
through): the command ``python -m conformance token`` makes one from ``secrets.token_urlsafe(32)``
(256 bits; Python's ``secrets`` documentation: "32 bytes (256 bits) of randomness is sufficient").
"""

from __future__ import annotations

import math
import os
import secrets
import stat
import string
from pathlib import Path

MIN_TOKEN_BITS = 128
MIN_DISTINCT_CHARACTERS = 8
TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits
CHARACTER_CLASSES = (
    (frozenset(string.ascii_lowercase), 26),
    (frozenset(string.ascii_uppercase), 26),
    (frozenset(string.digits), 10),
)
OTHER_CLASS_SIZE = 33  # string.punctuation and the space; a non-ASCII character is counted here too
HOW_TO_MAKE = (
    "make one with `python -m conformance token --file FILE` and give every node that file (--run-token-file) "
    "or its text in CONFORMANCE_RUN_TOKEN; under SLURM, MUNGE signs the run without one"
)


def new_token() -> str:
    """A run token of 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def estimated_bits(token: str) -> float:
    """The rule's estimate: length x log2(the size of the character classes the token uses)."""
    alphabet = sum(size for members, size in CHARACTER_CLASSES if any(c in members for c in token))
    if any(all(c not in members for members, _ in CHARACTER_CLASSES) for c in token):
        alphabet += OTHER_CLASS_SIZE
    return len(token) * math.log2(alphabet) if alphabet > 1 else 0.0


def weak_token(token: str) -> str | None:
    """Why ``token`` is too weak to sign a run (the token itself never shown), or None when it is strong."""
    bits, distinct = estimated_bits(token), len(set(token))
    if bits >= MIN_TOKEN_BITS and distinct >= MIN_DISTINCT_CHARACTERS:
        return None
    why = f"about {bits:.0f} bits" if bits < MIN_TOKEN_BITS else f"only {distinct} different characters"
    return (
        f"the run token ({len(token)} characters, not shown) is guessable ({why}; a token needs {MIN_TOKEN_BITS} bits "
        f"and {MIN_DISTINCT_CHARACTERS} different characters): {HOW_TO_MAKE}"
    )


def token_file_refused(path: Path) -> str | None:
    """Why the token file at ``path`` is refused (None: it may be read), as OpenSSH refuses a private key.

    OpenSSH's rule, followed here: authfile.c ``sshkey_perm_ok`` refuses a key file of the user's
    whose mode has any bit of 077 ("UNPROTECTED PRIVATE KEY FILE ... Permissions 0644 ... are too
    open"), and auth.c's ``safe_path`` (StrictModes) refuses a file owned by anyone but the user or
    root ("bad ownership or modes for file").  Another user who can read the file has the token;
    one who can write it, or owns it, chooses it.
    """
    try:
        found = os.stat(path)
    except OSError:
        return None  # the reader names what is wrong with the path
    if found.st_uid not in (os.getuid(), 0):
        return (
            f"is owned by uid {found.st_uid}, not by this user (uid {os.getuid()}) or root: chown it, or make a new one"
        )
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o077:
        return f"is open to group or others (mode {mode:04o}; like an ssh key it must be 0600 or 0400): chmod 600 it"
    return None
