"""``python -m tls [--out DIR] [--force] [--host NAME ...]``: write the dev PKI."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from switchboard.tls.pki import DEV_HOSTS, write_dev_pki


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tls",
        description="Write a dev CA, a server certificate and client certificates for a client and "
                    "for the gateway (MindIE file names).",
    )
    parser.add_argument("--out", type=Path, default=Path("tls/dev"), help="folder to write to (default: tls/dev)")
    parser.add_argument("--force", action="store_true", help="regenerate even if all files already exist")
    parser.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="NAME",
        help=f"DNS name or IP address for the server certificate, repeatable (default: {' '.join(DEV_HOSTS)})",
    )
    args = parser.parse_args(argv)
    try:
        paths = write_dev_pki(args.out, hosts=tuple(args.hosts or DEV_HOSTS), overwrite=args.force)
    except (OSError, ValueError) as exc:
        parser.exit(1, f"python -m tls: {exc}\n")
    print(f"dev PKI in {paths.folder}: {', '.join(path.name for path in paths.files())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
