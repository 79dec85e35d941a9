"""Every code block of the user docs runs, so the docs cannot drift from the code.

README.md and docs/*.md (and any page under docs/decisions/ with a runnable block) are
read with markdown-it-py. A fenced block is, by its info string and what precedes it:

* ``python``: run. A page's Python blocks run in order in one namespace, in one fresh
  interpreter whose working directory is a temporary directory, so a later block may
  use the names an earlier one made. A traceback names the page and its line.
* ``sh``, ``console``, ``bash``, ``shell``, or no info string, with lines that start
  with ``$ ``: a terminal session, run through the installed ``disklesslog`` CLI with
  bash in the page's temporary directory, in order. A command is the ``$ `` line (and
  the lines it continues with a trailing backslash); the lines after it, up to the
  next ``$ ``, are what it prints (stdout and stderr, as a terminal shows them), and
  must match. In expected output, ``...`` matches any text within a line, and a line
  that is only ``...`` matches any number of lines. Exit statuses are not checked
  (``echo $?`` shows one where it matters).
* ``sh``/``bash``/``shell`` without ``$ ``: a script; every command must succeed.
* anything else (``text``, ``json``, no info string): text, such as diagrams, file
  layouts or output. An untagged block that looks like a command or code (it starts
  with ``disklesslog ``, ``./dev ``, ``import `` and the like) is an error: tag it.

HTML comments right before a fence (blank lines between are fine) steer it:

* ``<!-- not-run: REASON -->``: the block is not run; the reason is required.
* ``<!-- setup: ... -->``: hidden code (Python, or shell commands) run just before the
  block, in the same namespace or directory: the names or files a fragment assumes.
* ``<!-- synopsis: ... -->``: the block is the CLI's synopsis, one ``disklesslog COMMAND
  [--option ...]`` line per command: checked against the CLI's parser both ways (every
  command there is listed; every command and option listed exists).
* ``<!-- volatile: WORD... -->``: words of the block's expected output that differ from
  run to run (a timestamp, a checksum over one); each matches any text.

And anywhere in a page:

* ``<!-- doc-paths: /data /var/lib/myapp/log -->``: absolute paths the page's examples
  use; the test maps them into its temporary directory, in code and commands, and back
  in the output it compares.
* ``<!-- doc-s3: http://localhost:9000 -->``: an S3 endpoint URL the page's examples
  use; the test replaces it with the local S3 test server (moto), so the page runs
  under the ``s3`` mark.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from disklesslog.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

PYTHON = frozenset({"python", "py", "python3"})
SHELL = frozenset({"sh", "bash", "shell", "console"})
LOOKS_RUNNABLE = re.compile(
    r"^(\$ |disklesslog |\./dev |\.venv/|git |pip |python|sqlite3 |import |from \S+ import )"
)
"""The first line of an untagged block that is really a command or code."""
NEVER_RUN = re.compile(r"(^|[\s$|;&(])(pip install|\./dev )", re.MULTILINE)
"""Commands a test must not run (they install packages or run the project's tooling):
a runnable block with one is an error until it is marked not-run."""

PROMPT = "$ "
COMMAND_TIMEOUT = 60
"""Seconds a command or a page's Python may take: one that waits for input fails."""
SLOW_PAGES = frozenset({"docs/cli.md", "docs/testing.md"})
"""Pages that take 10-25 s: cli.md starts the CLI some 30 times (~0.5 s each), testing.md
starts a moto server of its own. They run in the whole suite, not under -m "not slow"."""


class DocFormatError(Exception):
    """A page's blocks or directives break the conventions of this module."""


@dataclass
class Block:
    """One fenced block: where it is, its language, its text and how to treat it."""

    page: str
    line: int  # 1-based line of the block's first line of content
    kind: str  # "python", "session", "script" or "text"
    code: str
    not_run: str | None = None
    setup: str | None = None
    volatile: tuple[str, ...] = ()
    synopsis: bool = False


@dataclass
class Page:
    """A Markdown page's blocks and page-wide directives."""

    name: str
    blocks: list[Block] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    s3_endpoint: str | None = None

    def runnable(self, kind: str) -> list[Block]:
        return [b for b in self.blocks if b.kind == kind and b.not_run is None]


PROSE = frozenset({"paragraph_open", "heading_open", "table_open", "blockquote_open", "hr"})
"""What may not come between a block's directives and the block."""
DIRECTIVE = re.compile(r"<!--\s*([a-z0-9-]+):(.*?)-->", re.DOTALL)


def _kind(info: str, code: str) -> str:
    language = (info.split(maxsplit=1) or [""])[0].lower()
    has_prompt = any(line.startswith(PROMPT) for line in code.splitlines())
    if language in PYTHON:
        return "python"
    if language in SHELL:
        return "session" if has_prompt else "script"
    if language == "" and has_prompt:
        return "session"
    return "text"


def parse_page(text: str, name: str) -> Page:
    """The page's blocks with their directives; raises :class:`DocFormatError` for a
    runnable-looking untagged block or a directive without what it needs."""
    page = Page(name)
    pending: list[tuple[str, str]] = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type == "html_block":
            for directive, value in DIRECTIVE.findall(token.content):
                if directive == "doc-paths":
                    page.paths.extend(value.split())
                elif directive == "doc-s3":
                    page.s3_endpoint = value.strip()
                elif directive in {"not-run", "setup", "volatile", "synopsis"}:
                    pending.append((directive, value))
                else:
                    raise DocFormatError(f"{name}: unknown directive <!-- {directive}: -->")
            continue
        if token.type != "fence" or token.map is None:
            if pending and token.map is not None and token.type in PROSE:
                where = f"{name}:{token.map[0] + 1}"
                raise DocFormatError(f"{where}: a directive not followed by a block")
            continue
        line = token.map[0] + 2
        block = Block(name, line, _kind(token.info, token.content), token.content)
        for directive, value in pending:
            if directive == "not-run":
                if not value.strip():
                    raise DocFormatError(f"{name}:{line}: not-run needs a reason")
                block.not_run = value.strip()
            elif directive == "synopsis":
                block.synopsis = True
            elif directive == "volatile":
                block.volatile = tuple(value.split())
            else:
                block.setup = textwrap.dedent(value.strip("\n"))
        pending = []
        first = next((ln for ln in token.content.splitlines() if ln.strip()), "")
        untagged = block.kind == "text" and not token.info.strip()
        untagged = untagged and block.not_run is None and not block.synopsis
        if untagged and LOOKS_RUNNABLE.match(first):
            raise DocFormatError(
                f"{name}:{line}: an untagged block that looks runnable ({first!r}): "
                "tag it (```python, ```sh, ```console) and run it or mark it not-run"
            )
        if block.kind in {"session", "script"} and block.not_run is None:
            found = NEVER_RUN.search(block.code)
            if found:
                raise DocFormatError(
                    f"{name}:{line}: {found.group(2).strip()!r} is not for a test to run: "
                    "mark the block <!-- not-run: REASON -->"
                )
        page.blocks.append(block)
    return page


def _has_code(path: Path) -> bool:
    try:
        return any(b.kind != "text" for b in parse_page(path.read_text(), path.name).blocks)
    except DocFormatError:
        return True  # its test reports what is wrong


def doc_pages() -> list[Path]:
    """README.md, docs/*.md, and the decision records that have a runnable block."""
    decisions = [p for p in sorted((ROOT / "docs" / "decisions").glob("*.md")) if _has_code(p)]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *decisions]


# ------------------------------------------------------------------ running


class Places:
    """Maps a page's absolute paths (and its S3 endpoint) into the test's world and back."""

    def __init__(self, page: Page, tmp: Path, s3_endpoint: str | None) -> None:
        self.to_real: dict[str, str] = {p: str(tmp) + p for p in page.paths}
        if page.s3_endpoint is not None and s3_endpoint is not None:
            self.to_real[page.s3_endpoint] = s3_endpoint
        for path in page.paths:
            (tmp / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        keys = sorted(self.to_real, key=len, reverse=True)
        self._pattern = (
            re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, keys)) + r")(?![\w.-])")
            if keys
            else None
        )

    def real(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self.to_real[m.group(1)], text)

    def shown(self, text: str) -> str:
        for doc, real in sorted(self.to_real.items(), key=lambda kv: -len(kv[1])):
            text = text.replace(real, doc)
        return text


def _environment() -> dict[str, str]:
    """The installed CLI first on PATH; no colour or pager; the page's own settings."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["NO_COLOR"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr interleave as on a terminal
    env["COLUMNS"] = "100"
    return env


DRIVER = """\
import json, sys
namespace = {"__name__": "__main__"}
for page, line, code in json.loads(sys.stdin.read()):
    exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
"""


def run_python(page: Page, places: Places, cwd: Path) -> None:
    """Run the page's Python blocks (each after its setup) in order in one interpreter."""
    chunks: list[tuple[str, int, str]] = []
    for block in page.runnable("python"):
        if block.setup is not None:
            chunks.append((f"{page.name} (setup before line {block.line})", 1, block.setup))
        chunks.append((page.name, block.line, block.code))
    if not chunks:
        return
    result = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps([[p, ln, places.real(c)] for p, ln, c in chunks]),
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"a Python block of {page.name} failed:\n{places.shown(result.stderr)}")


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """A session's ``(command, expected output lines)`` pairs, in order."""
    pairs: list[tuple[str, list[str]]] = []
    lines = block.code.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith(PROMPT):
            raise DocFormatError(f"{block.page}:{block.line + i}: output before any command")
        command = lines[i][len(PROMPT) :]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command + "\n" + lines[i]
        i += 1
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith(PROMPT):
            output.append(lines[i])
            i += 1
        pairs.append((command, output))
    return pairs


def output_matches(expected: list[str], actual: list[str], volatile: tuple[str, ...] = ()) -> bool:
    """Whether ``actual`` lines match ``expected`` with ``...`` and the ``volatile``
    words as the only wildcards (within a line: any text; ``...`` as a whole line: any
    number of lines). Trailing spaces and trailing blank lines do not count."""
    pattern = ""
    for shown in expected:
        line = shown.rstrip()
        for word in volatile:
            line = line.replace(word, "...")
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += ".*?".join(map(re.escape, line.split("..."))) + r"[ \t]*\n"
    text = "".join(line.rstrip() + "\n" for line in actual)
    return re.fullmatch(pattern, text.rstrip("\n") + "\n" if text.strip() else "") is not None


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {COMMAND_TIMEOUT} s (waits for input?):\n{command}")


def _setup(block: Block, places: Places, cwd: Path) -> None:
    if block.setup is None:
        return
    script = "\n".join(line.removeprefix(PROMPT) for line in block.setup.splitlines())
    result = _bash("set -e\n" + places.real(script), cwd)
    if result.returncode != 0:
        pytest.fail(f"{block.page}:{block.line}: the block's setup failed:\n{result.stdout}")


def run_shell(page: Page, places: Places, cwd: Path) -> None:
    """Run the page's sessions and scripts in order in one directory; compare outputs."""
    for block in page.blocks:
        if block.not_run is not None or block.kind not in {"session", "script"}:
            continue
        _setup(block, places, cwd)
        if block.kind == "script":
            result = _bash("set -e\n" + places.real(block.code), cwd)
            if result.returncode != 0:
                pytest.fail(
                    f"{page.name}:{block.line}: a command of the block failed "
                    f"(exit {result.returncode}):\n{places.shown(result.stdout)}"
                )
            continue
        pairs = commands(block)
        outputs = _session_outputs([places.real(c) for c, _ in pairs], cwd)
        for (command, expected), output in zip(pairs, outputs):
            actual = places.shown(output).splitlines()
            if not output_matches(expected, actual, block.volatile):
                pytest.fail(
                    f"{page.name}:{block.line}: $ {command}\n"
                    "--- the page shows:\n" + "\n".join(expected) + "\n"
                    "--- it printed:\n" + "\n".join(actual)
                )


SEPARATOR = "@@ end of a documented command @@"


def _session_outputs(command_lines: list[str], cwd: Path) -> list[str]:
    """Each command's output, from one shell that runs them all as a terminal would
    (so ``$?``, variables and ``cd`` carry over): a separator line after each command,
    printed without changing ``$?``."""
    after = f'status=$?; printf "\\n%s\\n" "{SEPARATOR}"; (exit $status)'
    script = "exec 2>&1\n" + "".join(f"{c}\n{after}\n" for c in command_lines)
    pieces = _bash(script, cwd).stdout.split(f"\n{SEPARATOR}\n")
    return [*pieces[: len(command_lines)], *[""] * (len(command_lines) + 1 - len(pieces))]


# -------------------------------------------------------------------- tests


def _page_param(path: Path) -> object:
    name = path.relative_to(ROOT).as_posix()
    try:
        page = parse_page(path.read_text(), name)
    except DocFormatError:  # test_page_runs reports it, without stopping the collection
        page = Page(name)
    marks = [pytest.mark.s3] if page.s3_endpoint else []
    if name in SLOW_PAGES:
        marks.append(pytest.mark.slow)
    return pytest.param(path, id=name, marks=marks)


PAGES = doc_pages()


def test_every_page_follows_the_conventions() -> None:
    """Parsing checks every block: untagged runnable-looking blocks, directives."""
    blocks = [b for p in PAGES for b in parse_page(p.read_text(), str(p)).blocks]
    assert len(PAGES) >= 9
    assert sum(b.kind != "text" and b.not_run is None for b in blocks) >= 20


@pytest.mark.parametrize("path", [_page_param(p) for p in PAGES])
def test_page_runs(path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page = parse_page(path.read_text(), path.relative_to(ROOT).as_posix())
    endpoint = request.getfixturevalue("s3_server") if page.s3_endpoint else None
    places = Places(page, tmp_path, endpoint)
    run_python(page, places, tmp_path)
    run_shell(page, places, tmp_path)


def synopsis_errors(block: Block) -> list[str]:
    """How a synopsis block and the CLI's parser disagree (nothing when they agree).

    argparse has no public way to list a parser's subcommands and options; its
    ``_actions`` and ``_option_string_actions`` are what help renderers such as
    sphinx-argparse and argcomplete read too."""
    parser = build_parser()
    commands_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers: dict[str, argparse.ArgumentParser] = dict(commands_action.choices)
    listed: dict[str, set[str]] = {}
    top: set[str] = set()
    for line in block.code.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != "disklesslog":
            continue
        options = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
        if words[1].startswith("-"):
            top |= options
        else:
            listed[words[1]] = options
    where = f"{block.page}:{block.line}"
    errors = [f"{where}: no line for the command {c!r}" for c in sorted(set(parsers) - set(listed))]
    errors += [f"{where}: no such command {c!r}" for c in sorted(set(listed) - set(parsers))]
    for name, options in sorted(listed.items()):
        if name in parsers:
            known = set(parsers[name]._option_string_actions)
            errors += [f"{where}: {name} has no option {o}" for o in sorted(options - known)]
    known_top = set(parser._option_string_actions)
    errors += [f"{where}: disklesslog has no option {o}" for o in sorted(top - known_top)]
    return errors


def test_cli_synopses_match_the_parser() -> None:
    synopses = [b for p in PAGES for b in parse_page(p.read_text(), p.name).blocks if b.synopsis]
    assert synopses, "docs/cli.md has a synopsis block"
    assert [e for b in synopses for e in synopsis_errors(b)] == []


# ------------------------------------------------------------ the harness itself

FAKE = """\
<!-- doc-paths: /srv/app -->

```python
import pathlib
pathlib.Path("/srv/app").mkdir()
value = 41
```

Then:

```python
assert value + 1 == {answer}
```

<!-- setup: printf 'x\\n' > input.txt -->
```console
$ cat input.txt
x
$ echo /srv/app/data
/srv/app/data
$ printf 'a\\nb\\nc\\n'
a
...
```

<!-- not-run: needs a bucket -->
```python
raise SystemExit("never run")
```

```text
disklesslog is not run here: it is a text block
```
"""


def _run_fake(text: str, tmp_path: Path) -> None:
    page = parse_page(text, "fake.md")
    places = Places(page, tmp_path, None)
    run_python(page, places, tmp_path)
    run_shell(page, places, tmp_path)


def test_fake_page_that_is_right_passes(tmp_path: Path) -> None:
    _run_fake(FAKE.format(answer=42), tmp_path)
    assert (tmp_path / "srv" / "app").is_dir()  # the mapped path, not /srv/app


def test_fake_page_with_a_failing_python_block_fails(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r'File "fake.md", line 12'):
        _run_fake(FAKE.format(answer=43), tmp_path)


def test_fake_page_with_wrong_output_fails(tmp_path: Path) -> None:
    text = FAKE.format(answer=42).replace("$ cat input.txt\nx\n", "$ cat input.txt\ny\n")
    with pytest.raises(pytest.fail.Exception, match=r"fake.md:\d+: \$ cat input.txt"):
        _run_fake(text, tmp_path)


def test_fake_page_with_a_failing_script_fails(tmp_path: Path) -> None:
    text = "```sh\ntrue\ndisklesslog no-such-command\n```\n"
    with pytest.raises(pytest.fail.Exception, match="a command of the block failed"):
        _run_fake(text, tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("```\ndisklesslog streams log\n```\n", "looks runnable"),
        ("<!-- not-run: -->\n```python\npass\n```\n", "needs a reason"),
        ("<!-- not-run: why -->\n\nSome text.\n", "fake.md:3: a directive not followed"),
        ("<!-- nonsense: x -->\n", "unknown directive"),
        ("```sh\npip install 'disklesslog[s3]'\n```\n", "'pip install' is not for a test"),
        ("```console\n$ ./dev test\n```\n", "'./dev' is not for a test"),
    ],
)
def test_broken_conventions_are_refused(text: str, message: str) -> None:
    with pytest.raises(DocFormatError, match=message):
        parse_page(text, "fake.md")


def test_a_synopsis_that_drifted_is_reported() -> None:
    text = (
        "<!-- synopsis: the commands -->\n```\n"
        "disklesslog streams URL --shiny\n"
        "disklesslog teleport URL\n"
        "disklesslog --version\n```\n"
    )
    errors = synopsis_errors(parse_page(text, "fake.md").blocks[0])
    assert "fake.md:3: streams has no option --shiny" in errors
    assert "fake.md:3: no such command 'teleport'" in errors
    assert "fake.md:3: no line for the command 'produce'" in errors


@pytest.mark.parametrize(
    ("expected", "actual", "matches"),
    [
        (["a", "b"], ["a", "b  "], True),
        (["a", "b"], ["a", "c"], False),
        (["a"], ["a", "b"], False),
        (["a", "...", "d"], ["a", "b", "c", "d"], True),
        (["a", "...", "d"], ["a", "d"], True),
        (['{"t": ...}'], ['{"t": 1732230000000}'], True),
        (['{"t": 1732230000000}'], ['{"t": 1795886836195}'], False),
        ([], [], True),
        ([], ["unexpected"], False),
    ],
)
def test_output_matching(expected: list[str], actual: list[str], matches: bool) -> None:
    assert output_matches(expected, actual) is matches


def test_volatile_words_match_anything() -> None:
    expected = ['{"t": 1732230000000, "v": "a"}']
    assert output_matches(expected, ['{"t": 1795886836195, "v": "a"}'], ("1732230000000",))
    assert not output_matches(expected, ['{"t": 1795886836195, "v": "b"}'], ("1732230000000",))
