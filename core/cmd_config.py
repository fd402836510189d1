"""`podhealth config default|check FILE|show [--effective] FILE`."""

from __future__ import annotations

import argparse
import sys

from podhealth import config


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("config", help="print the default config or check a config file")
    csub = p.add_subparsers(dest="config_cmd", metavar="ACTION", required=True)
    d = csub.add_parser("default", help="print a commented default config")
    d.set_defaults(func=_default)
    c = csub.add_parser("check", help="validate a config file ('-' reads stdin)")
    c.add_argument("file")
    c.set_defaults(func=_check)
    s = csub.add_parser("show", help="print a config file as podhealth reads it (secrets hidden)")
    s.add_argument("file")
    s.add_argument("--effective", action="store_true",
                   help="only what the site's policy and checks change: each XID/SXid override next to the "
                        "catalog's decision, each threshold next to the profile's, each site check")
    s.set_defaults(func=_show)
    return p


def _show(args: argparse.Namespace) -> int:
    from podhealth import configload, policy_view

    try:
        text, source = (sys.stdin.read(), "<stdin>") if args.file == "-" else configload.read_file(args.file)
        cfg = config.loads(text, source)
    except config.ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if args.effective:
        sys.stdout.write(policy_view.render(cfg))
    else:
        sys.stdout.write(configload.render_default(cfg, mask=True) + "\n")
    return 0


def _default(args: argparse.Namespace) -> int:
    sys.stdout.write(config.default_yaml())
    return 0


def _check(args: argparse.Namespace) -> int:
    """Every error in the file (not only the first), one line each naming file, line and key;
    then the optional packages the file turns on but this install lacks. Exit 2 if any."""
    from podhealth import configload, extras

    try:
        text, source = (sys.stdin.read(), "<stdin>") if args.file == "-" else configload.read_file(args.file)
    except config.ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    errors = configload.check_text(config.Config, text, source)
    if not errors:
        cfg = config.loads(text, source)
        errors = [config.ConfigError(source, configload.line_of(text, key), key, str(missing))
                  for key, missing in extras.missing(cfg)]
    for err in errors:
        print(err, file=sys.stderr)
    if errors:
        if len(errors) > 1:
            print(f"{args.file}: {len(errors)} errors", file=sys.stderr)
        return 2
    for key, what in _site_programs(config.loads(text, source)):
        # A note, not an error: a config is often checked on another host than the nodes it is for.
        print(f"{source}:{configload.line_of(text, key)}: {key}: note: {what} on this host "
              "(the check will be UNKNOWN where it is so)", file=sys.stderr)
    print(f"{args.file}: OK")
    return 0


def _site_programs(cfg: config.Config) -> list[tuple[str, str]]:
    """(key, what is wrong) for each enabled site check whose program is not runnable here."""
    import os

    out = []
    for name, sc in cfg.checks.site.items():
        prog = sc.argv[0]
        if sc.enabled and not (os.path.isfile(prog) and os.access(prog, os.X_OK)):
            what = "not an executable file" if os.path.exists(prog) else "does not exist"
            out.append((f"checks.site.{name}.argv", f"{prog} {what}"))
    return out
