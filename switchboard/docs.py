"""`python -m switchboard.docs` (`make docs`): rewrites the generated tables in docs/ from the
code's own tables, so that the docs cannot restate a route, a range or a flag wrongly.

A generated block is the text between `<!-- generated: NAME -->` and `<!-- end generated -->`:
`routes` (the gateway's route table and its OpenAPI summaries), `parameters` (the engine's
request parameters: names, types, ranges and defaults from its validation; what each means
from PARAMETER_NOTES below) and `flags` (the `switchboard` command's argparse parser). With
`--check` nothing is written, and the exit status is 1 where a doc differs from the code.
This module sits above the gateway and the engine; each table imports only its own side, so
the routes and flags tables load no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

DOCS = Path(__file__).resolve().parents[1] / "docs"
FIX_COMMAND = "make docs"
BLOCK = re.compile(r"(?P<open><!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)"
                   r"(?P<close><!-- end generated -->)", re.S)


def cell(text: str) -> str:
    """Text fit for a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- routes -----------------------------------------------------------------------------------

def routes_table() -> str:
    """One row per route and method of every plane, in the route table's order, with the
    summary and the error shape (protocol) its OpenAPI document gives it."""
    from switchboard.gateway import app, openapi

    served: dict[str, tuple[openapi.Route, list[str]]] = {}
    for plane, rules in app.ROUTES.items():
        for pattern, handler, name in rules:
            route, planes = served.setdefault(
                pattern, (openapi.Route(plane.value, pattern, handler, name), []))
            planes.append(plane.value)
    routes = [route for route, _ in served.values()]
    # The paths are the same whatever the server's parameter limits.
    paths = openapi.document(routes, {})["paths"]
    rows = []
    for route, planes in served.values():
        templates = [template for template, _ in openapi.path_templates(route.pattern)]
        operations = paths[templates[-1]]
        by_summary: dict[tuple[str, str], list[str]] = {}
        for method, operation in operations.items():
            protocol = next(tag for tag in operation["tags"] if tag not in openapi.PLANES)
            by_summary.setdefault((operation["summary"], protocol), []).append(method.upper())
        for (summary, protocol), methods in by_summary.items():
            rows.append((", ".join(methods), f"`{_display_path(templates)}`",
                         ", ".join(planes), protocol, summary))
    return table(("method", "path", "plane", "errors as", "what"), rows)


def _display_path(templates: list[str]) -> str:
    """A route's paths as one: the part an optional group adds in brackets
    (`/v2/models/{model}[/versions/{version}]/infer`)."""
    if len(templates) == 1:
        return templates[0]
    short, long = templates
    prefix = os.path.commonprefix(templates)
    if prefix.endswith("/") and not long[len(prefix):].startswith("/"):
        prefix = prefix[:-1]
    suffix = short[len(prefix):]
    return f"{prefix}[{long[len(prefix):len(long) - len(suffix)]}]{suffix}"


# --- request parameters -----------------------------------------------------------------------

class Note(NamedTuple):
    """What a parameter means; `kind`, its JSON type where the engine's ranges do not say it;
    `default`, where the engine's SamplingParams do not hold it (or hold it otherwise)."""

    meaning: str
    kind: str = ""
    default: str = ""


def parameter_notes(validation) -> dict[str, Note]:
    """Every parameter the engine accepts, with its meaning (names and ranges quoted from
    `validation`, the engine's validation module)."""
    from switchboard.engine.params import DEFAULT_PRIORITY, DEFAULT_TIMEOUT_S
    from switchboard.proto.generation_fields import MINDIE_MIN_SEED

    mindie_seeds = dataclasses.replace(validation.INT_RANGES["seed"], low=MINDIE_MIN_SEED)
    hints = ", ".join(f"`{name}`" for name in validation.SAMPLING_HINTS)
    return {
        "do_sample": Note("sample rather than decode greedily", default=f"sample if any of "
                          f"{hints} is given, else greedy"),
        "temperature": Note("divides the logits before sampling"),
        "top_k": Note("keep the k most likely tokens; 0 = off, at least the vocabulary = all"),
        "top_p": Note("nucleus sampling: the most likely tokens whose probabilities add up to p"),
        "typical_p": Note("locally typical sampling"),
        "min_p": Note("keep tokens at least this fraction as likely as the most likely one "
                      "(vLLM's); 0 = off"),
        "repetition_penalty": Note("over the prompt's and the generated tokens (CTRL's)"),
        "presence_penalty": Note("over the generated tokens (OpenAI's)"),
        "frequency_penalty": Note("over the generated tokens (OpenAI's)"),
        "seed": Note(f"the sampling seed; MindIE's routes and KServe v2 take "
                     f"{_interval(mindie_seeds)}, as MindIE documents it",
                     default="drawn, reported back: send it again to reproduce a sampled "
                     "answer"),
        "max_new_tokens": Note("the most tokens to generate, capped by `maxIterTimes` and by "
                               "what fits in `maxSeqLen` after the prompt",
                               default=f"{validation.DEFAULT_MAX_NEW_TOKENS}, or "
                               "`min_new_tokens` where that is more"),
        "min_new_tokens": Note("no end-of-sequence token, stop token or stop string before "
                               "this many; refused past `max_new_tokens` (as vLLM refuses "
                               "`min_tokens` past `max_tokens`) or past what the limits leave "
                               "(`maxIterTimes`, `maxSeqLen` less the prompt)"),
        "ignore_eos": Note("keep generating past end-of-sequence tokens"),
        "skip_special_tokens": Note("leave special tokens the model generates (with "
                                    "`ignore_eos`, EOS) out of the text; the token that ends a "
                                    "request is never in it"),
        "stop": Note(f"stop strings, at most {validation.MAX_STOP_SEQUENCES}",
                     kind="string or list of strings"),
        "stop_token_ids": Note("token ids that end generation", kind="list of ints"),
        "include_stop_str_in_output": Note("the text ends after the stop string that ended it, "
                                           "not before"),
        "truncate": Note("keep only the prompt's last this many tokens (TGI's)",
                         default="the whole prompt"),
        "allowed_token_ids": Note("the only tokens that may be generated (vLLM's)",
                                  kind="list of ints", default="all"),
        "logit_bias": Note(f"token id → bias in {_interval(validation.LOGIT_BIAS_RANGE)}, "
                           "added to its logit before a token is chosen (OpenAI's)",
                           kind="object"),
        "guided_json": Note("structured output: the text is a JSON value the schema "
                            "validates, then EOS (vLLM's)", kind="JSON schema"),
        "guided_regex": Note("structured output: the text matches the regular expression, "
                             "then EOS (vLLM's)", kind="string"),
        "guided_choice": Note("structured output: the text is one of the strings (vLLM's)",
                              kind="list of strings"),
        "logprobs": Note("report each generated token's log-probability", default="false"),
        "top_logprobs": Note("alternatives reported with each token's log-probability; needs "
                             "`logprobs`", default="0"),
        "prompt_logprobs": Note("report the prompt tokens' log-probabilities (computed in the "
                                "prefill, which then skips the prefix cache)"),
        "n": Note("sequences answered"),
        "best_of": Note("sequences generated, the `n` most likely answered; needs sampling",
                        default="`n`"),
        "priority": Note("1 highest; orders the waiting queue",
                         default=str(DEFAULT_PRIORITY)),
        "timeout": Note("seconds: the request ends with an error when it passes",
                        default=f"{DEFAULT_TIMEOUT_S:g}"),
        "watermark": Note("MindIE's and TGI's: checked and ignored, no watermark is applied, "
                          "as in MindIE"),
        "details": Note("MindIE's: checked, without effect on generation"),
        "perf_stat": Note("MindIE's: checked, without effect on generation"),
        "batch_size": Note("MindIE's: checked, without effect on generation"),
    }


def parameters_table() -> str:
    """The engine's request parameters: FLOAT_RANGES, INT_RANGES, BOOL_PARAMS and the rest of
    SUPPORTED_PARAMS, in that order, with their SamplingParams defaults; then what MindIE's
    interfaces accept without effect (generation_fields)."""
    from switchboard.engine import validation
    from switchboard.engine.params import SamplingParams
    from switchboard.proto import generation_fields as fields

    notes = parameter_notes(validation)
    ignored = {**dict.fromkeys(fields.MINDIE_IGNORED_FLAGS, ("bool", "", "false")),
               fields.MINDIE_IGNORED_COUNT: ("int", "≥ 1", "none")}
    supported = validation.SUPPORTED_PARAMS | ignored.keys()
    if undocumented := sorted(supported - notes.keys()):
        raise ValueError(f"parameters without a note in {__name__}.parameter_notes: "
                         f"{', '.join(undocumented)}")
    if stale := sorted(notes.keys() - supported):
        raise ValueError(f"notes in {__name__}.parameter_notes for parameters the engine does "
                         f"not accept: {', '.join(stale)}")
    defaults = {field.name: field.default for field in dataclasses.fields(SamplingParams)}
    kinds = {**{name: "float" for name in validation.FLOAT_RANGES},
             **{name: "int" for name in validation.INT_RANGES},
             **{name: "bool" for name in validation.BOOL_PARAMS}}
    ranges = {**validation.FLOAT_RANGES, **validation.INT_RANGES}
    order = [*kinds, *sorted(validation.SUPPORTED_PARAMS - kinds.keys())]
    rows = []
    for name in order:
        note = notes[name]
        absent = False if kinds.get(name) == "bool" else None
        default = note.default or _default(defaults.get(name, absent))
        rows.append((f"`{name}`", note.kind or kinds[name],
                     _interval(ranges[name]) if name in ranges else "", default, note.meaning))
    rows += [(f"`{name}`", kind, bounds, default, notes[name].meaning)
             for name, (kind, bounds, default) in ignored.items()]
    return table(("parameter", "type", "range", "default", "meaning"), rows)


def _default(value: object) -> str:
    """A default as the docs write it."""
    if value is None or value in ((), frozenset()):
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _interval(interval) -> str:
    """An engine Interval, its large bounds as powers of two."""
    return (f"{'(' if interval.low_open else '['}{_bound(interval.low)}, "
            f"{_bound(interval.high)}{')' if interval.high_open else ']'}")


def _bound(value: float) -> str:
    if math.isinf(value):
        return "∞"
    for bits in (31, 63, 64):
        if value == 2**bits - 1:
            return f"2^{bits} − 1"
    return f"{value:g}" if not float(value).is_integer() else str(int(value))


# --- command-line flags -----------------------------------------------------------------------

def flags_table() -> str:
    """Every flag of `switchboard server`, `gateway` and `run`, with the commands that take it
    and its help (which states its default)."""
    from switchboard import cli

    commands = next(action for action in cli._parser()._actions
                    if isinstance(action, argparse._SubParsersAction))
    flags: dict[str, tuple[argparse.Action, list[str]]] = {}
    for command, parser in commands.choices.items():
        if parser.prog.split()[-1] != command:  # an alias (serve)
            continue
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                flags.setdefault(action.option_strings[0], (action, []))[1].append(command)
    rows = [(f"`{_usage(action)}`", ", ".join(used_by), action.help or "")
            for action, used_by in flags.values()]
    return table(("flag", "commands", "meaning"), rows)


def _usage(action: argparse.Action) -> str:
    flag = action.option_strings[0]
    if action.nargs == 0:
        return flag
    if action.choices is not None:
        return f"{flag} {{{','.join(action.choices)}}}"
    return f"{flag} {action.metavar or action.dest.upper()}"


# --- the blocks -------------------------------------------------------------------------------

TABLES: dict[str, Callable[[], str]] = {
    "routes": routes_table,
    "parameters": parameters_table,
    "flags": flags_table,
}


def render(text: str, tables: dict[str, str] | None = None) -> str:
    """`text` with each generated block's body replaced by its table (`tables` caches them)."""
    tables = {} if tables is None else tables

    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(TABLES)}")
        if name not in tables:
            tables[name] = TABLES[name]()
        return f"{match['open']}\n{tables[name]}\n{match['close']}"

    return BLOCK.sub(body, text)


def documents(folder: Path = DOCS) -> list[Path]:
    """The Markdown files of `folder` that hold a generated block."""
    return [path for path in sorted(folder.glob("*.md")) if BLOCK.search(path.read_text())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchboard.docs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 where a doc differs from the code")
    parser.add_argument("--docs", type=Path, default=DOCS, help=f"default: {DOCS}")
    args = parser.parse_args(argv)
    tables: dict[str, str] = {}
    stale = []
    for path in documents(args.docs):
        text = path.read_text()
        rendered = render(text, tables)
        if rendered != text:
            stale.append(path)
            if not args.check:
                path.write_text(rendered)
    for path in stale:
        print(f"{path}: {'out of date' if args.check else 'rewritten'}")
    if args.check and stale:
        print(f"run `{FIX_COMMAND}` to regenerate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
