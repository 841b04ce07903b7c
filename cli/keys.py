"""bkctl keys: CURVE key pairs for bookies and clients on tcp endpoints
(docs/SECURITY.md, "Network: CURVE").  A thin command over
``appliance.curve.generate_keys``."""

from __future__ import annotations

import click

from cli.common import library_errors


@click.group(short_help="CURVE key pairs for hosts.")
def keys():
    """CURVE keys: a host's key pair, exchanged as public .key files."""


@keys.command(short_help="Write a new CURVE key pair.")
@click.argument("name")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default="keys",
              show_default=True, help="Where to write NAME.key and NAME.key_secret "
              "(created 0700 if missing).")
@library_errors
def generate(name, directory):
    """Write a new CURVE key pair: DIR/NAME.key (public: copy it into the
    authorized_keys_dir of the bookies this host talks to, or the
    trusted_keys_dir of their clients) and DIR/NAME.key_secret (secret,
    mode 0600: set [security] key_file to it).  Never overwrites; prints
    the public key (Z85).

    \b
    Example:
      bkctl keys generate host-a --dir /etc/appliance/keys
      cp /etc/appliance/keys/host-a.key /etc/appliance/authorized/
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.curve import directory_open_to_others, generate_keys

    try:
        public_path, secret_path, public_key = generate_keys(name, directory)
    except FileExistsError as exc:
        raise click.ClickException(str(exc)) from None
    if directory_open_to_others(directory):
        click.echo(f"warning: {directory} is open to other accounts; chmod 700 {directory}",
                   err=True)
    click.echo(f"wrote {public_path} (public) and {secret_path} (secret, 0600)", err=True)
    click.echo(public_key)
