"""The `hook` and `hooks install [--rollback]` subcommands of `ai1net-bridge` (registered by cli.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from clients.bridge.cli import add_home_argument

    hook = subparsers.add_parser("hook", help="run by the agent host (Claude Code) for each hook event")
    hook.add_argument("--window", type=float, default=120.0, help="seconds to wait for the phone's answer")
    hook.add_argument("--answer-style", choices=("allow", "deny"), default="allow")
    add_home_argument(hook)
    hook.set_defaults(func=cmd_hook)

    hooks = subparsers.add_parser("hooks", help="manage the agent host's hook entries")
    hooks_sub = hooks.add_subparsers(dest="hooks_command", metavar="ACTION")
    install = hooks_sub.add_parser("install", help="add the bridge's hooks to settings.json (or --rollback)")
    install.add_argument("--agent", choices=("claude", "codex"), default="claude",
                         help="Claude Code (default) or OpenAI Codex CLI (README: Codex CLI)")
    install.add_argument("--settings", type=Path, default=None,
                         help="default: ~/.claude/settings.json; with --agent codex: $CODEX_HOME/hooks.json")
    install.add_argument("--answer-style", choices=("allow", "deny"), default="allow")
    install.add_argument("--window", type=int, default=120, help="seconds the question waits for the phone")
    install.add_argument("--command", dest="launcher", default=None, help="how to start the bridge (advanced)")
    install.add_argument("--approve", metavar="TOOLS", default=None,
                         help="approve tool calls from the phone: these tools always (e.g. Bash,Write,Edit), "
                              "others when Claude Code asks; 'asked': only when Claude Code asks")
    install.add_argument("--rollback", action="store_true", help="remove exactly what install added")
    add_home_argument(install)
    install.set_defaults(func=cmd_hooks_install)
    hooks.set_defaults(func=lambda args: hooks.print_help() or 2)


def cmd_hook(args: argparse.Namespace) -> int:
    from clients.bridge.cli import home_dir
    from clients.bridge.hook import run

    return run(str(home_dir(args)), window=args.window, style=args.answer_style)


def cmd_hooks_install(args: argparse.Namespace) -> int:
    from clients.bridge.cli import home_dir
    from clients.bridge.hooks_install import HooksInstallError, install, parse_approve, rollback

    home = home_dir(args)
    if getattr(args, "agent", "claude") == "codex":
        from clients.bridge.codex import run_cli

        return run_cli(args, home)
    try:
        if args.rollback:
            done = rollback(home=home, settings_path=args.settings)
            if not done:
                print("nothing to roll back")
            for item in done:
                print(f"{item['settings']}: {item['action']}")
            return 0
        result = install(
            home=home,
            settings_path=args.settings,
            window=args.window,
            style=args.answer_style,
            launcher=args.launcher,
            approve=parse_approve(args.approve),
        )
    except HooksInstallError as exc:
        print(f"ai1net-bridge: {exc}", file=sys.stderr)
        return 1
    if result["changed"]:
        print(f"hooks installed in {result['settings']}")
        if result["backup"]:
            print(f"backup of the previous file: {result['backup']}")
    else:
        print(f"hooks already installed in {result['settings']}; nothing changed")
    print(f"hook command: {result['command']}")
    return 0
