"""The run token: what makes one strong enough, how to make one, and which token files are refused.

The token signs a run across nodes (``conformance/nodes/``).  Whoever reads node 0's store sees a
fresh challenge and each node's HMAC answer to it: with those, a token can be tested offline at
millions of guesses a second, so nothing but the token's own entropy stands between an eavesdropper
and a forged pass.  Hence the one rule, stated here and nowhere else:

    a run token must carry at least 128 bits, as zxcvbn counts them.

zxcvbn (Wheeler, "zxcvbn: Low-Budget Password Strength Estimation", USENIX Security 2016; the
``zxcvbn`` package) estimates how many guesses a guessing program needs: it splits the token into
what such a program tries first (dictionary words, repeats, sequences, keyboard runs, dates), each at
its own count, and brute-forces the rest at 10 guesses a character.  So
``conformanceconformanceconformance`` or ``0123456789`` repeated counts a few bits however long, and
a random token needs some 39 characters: ``python -m conformance token``'s 43 pass, as do
``openssl rand -base64 32`` and ``-hex 32``; 128 random bits in 32 hex digits do not (zxcvbn counts
106), which only means making a longer one.  zxcvbn reads at most 72 characters: those of a longer
token must carry the bits alone.

128 bits: NIST SP 800-57 Part 1 Rev. 5, Table 2, gives 128-bit security strength as acceptable
beyond 2031: a brute force of 2^128 HMACs is out of reach.  ``python -m conformance token`` makes one
from ``secrets.token_urlsafe(32)`` (256 bits; Python's ``secrets`` documentation: "32 bytes (256
bits) of randomness is sufficient").
"""

from __future__ import annotations

import math
import os
import secrets
import stat
from pathlib import Path

MIN_TOKEN_BITS = 128
TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits
ZXCVBN_MAX_LENGTH = 72  # zxcvbn 4.5 refuses a longer password (ValueError)
HOW_TO_MAKE = (
    "make one with `python -m conformance token --file FILE` and give every node that file (--run-token-file) "
    "or its text in CONFORMANCE_RUN_TOKEN; under SLURM, MUNGE signs the run without one"
)


def new_token() -> str:
    """A run token of 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def estimated_bits(token: str) -> float:
    """The rule's count of a token's bits: log2 of the guesses zxcvbn says its first 72 characters need."""
    from zxcvbn import zxcvbn  # the run's dependency; imported where a token is judged only

    return float(zxcvbn(token[:ZXCVBN_MAX_LENGTH])["guesses_log10"]) * math.log2(10)


def weak_token(token: str) -> str | None:
    """Why ``token`` is too weak to sign a run (the token itself never shown), or None when it is strong."""
    bits = estimated_bits(token)
    if bits >= MIN_TOKEN_BITS:
        return None
    return (
        f"the run token ({len(token)} characters, not shown) is guessable (about {bits:.0f} bits by zxcvbn's count; "
        f"a token needs {MIN_TOKEN_BITS}): {HOW_TO_MAKE}"
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
