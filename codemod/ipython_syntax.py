"""Where a notebook cell holds IPython syntax rather than Python: line magics (``%time f()``),
shell escapes (``!ls``, ``!!ls``), help queries (``x?``, ``??x``), the assignment forms
(``a = %time f()``, ``a = !ls``), and cell magics (``%%bash`` on the first line).

IPython finds them on tokens, not on text: only at the start of a logical line (so not on
a continuation line inside brackets or after a backslash, not inside a string or a
comment), one at a time, the earliest first, re-tokenising after each. When IPython is
installed its own transformer classes decide; otherwise ``own_magics`` applies the same
rules. Both give each piece of syntax as a span of lines, so the caller can hide it from
the Python parser and put it back verbatim.
"""
from __future__ import annotations

import builtins
import functools
import io
import keyword
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

_Tokens = list[tokenize.TokenInfo]


@dataclass(frozen=True)
class Magic:
  start: int   # first line of the span (0-based)
  stop: int    # one past its last line
  prefix: str  # the text before the syntax on its first line: an indent, or "a = "


# Cell magics whose body IPython runs as IPython code (the magic transforms and runs it);
# their body is converted like any cell. Any other cell magic's body is opaque.
PYTHON_BODY_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})


def cell_magic(lines: list[str]) -> tuple[int, str] | None:
  """(line, name) of a ``%%name`` cell magic: IPython takes one only on the first line
  that is not blank; ``%%name?`` is a help query, not a cell magic."""
  first = next((i for i, line in enumerate(lines) if line.strip()), None)
  if first is None or not lines[first].startswith("%%"):
    return None
  if re.match(r"%%\w+\?", lines[first]):
    return None
  return first, lines[first][2:].strip().partition(" ")[0]


_LINE_ESCAPES = tuple(",;/")  # escapes that are not among % ! ?


def magics(lines: list[str], bound: frozenset[str] = frozenset()) -> list[Magic]:
  """The spans of IPython syntax in a cell's lines (each ending in ``\\n``), by IPython's
  transformer when it is installed, else by ``own_magics``. A cell magic whose body is
  not Python is one span for the whole cell. A one-line cell may be an automagic
  (``automagic``; ``bound`` holds the names the notebook defines before the cell)."""
  if not any(c in line for line in lines for c in "%!?") and not any(
      line.lstrip().startswith(_LINE_ESCAPES) for line in lines):
    # the usual cell: nothing IPython could read as its own (tokenizing is slow)
    auto = automagic(lines, bound)
    return [] if auto is None else [auto]
  find = _ipython_finder() or own_magics
  magic = cell_magic(lines)
  if magic is None:
    found = find(lines)
    auto = automagic(lines, bound) if not found else None
    return found if auto is None else [auto]
  first, name = magic
  if name not in PYTHON_BODY_CELL_MAGICS:
    return [Magic(first, len(lines), "")]
  body = [Magic(m.start + first + 1, m.stop + first + 1, m.prefix)
          for m in find(lines[first + 1:])]
  return [Magic(first, first + 1, "")] + body


# IPython's default line magics (``%lsmagic`` of IPython 8 in a kernel on POSIX, the
# aliases ``ls``, ``cat``, ... included): automagic applies to these names.
LINE_MAGICS = frozenset("""
    alias alias_magic autoawait autocall automagic autosave bookmark cat cd clear colors
    conda config connect_info cp debug dhist dirs doctest_mode ed edit env gui hist history
    killbgscripts ldir less lf lk ll load load_ext loadpy logoff logon logstart logstate
    logstop ls lsmagic lx macro magic man matplotlib mkdir more mv notebook page pastebin
    pdb pdef pdoc pfile pinfo pinfo2 pip popd pprint precision prun psearch psource pushd
    pwd pycat pylab qtconsole quickref recall rehashx reload_ext rep rerun reset
    reset_selective rm rmdir run save sc set_env store sx system tb time timeit unalias
    unload_ext who who_ls whos xdel xmode""".split())
# IPython's split of a line into escape, function part and the rest (``split_user_input``).
_USER_INPUT = re.compile(r"^(\s*)(?:([,;/%]|!!?|\?\??)\s*)?([\w*.]+\?{0,2})?\s*(.*?)\s*$")


def automagic(lines: list[str], bound: frozenset[str] = frozenset()) -> Magic | None:
  """The line IPython runs as a magic without its ``%`` (automagic, on by default), e.g.
  ``timeit f(x)``. IPython's prefilter does this only for a cell of one line (after its
  own transforms): the line's first word is a line magic's name that no name of the
  session shadows (``bound``: what the notebook defines; builtins; keywords), and the
  rest does not start with ``=`` or ``,`` (an assignment: ``time = 3``)."""
  row = next((i for i, line in enumerate(lines) if line.strip()), None)
  if row is None or row != len(lines) - 1:
    return None  # after its leading blank lines, the cell has several: no prefilter
  match = _USER_INPUT.match(lines[row].rstrip("\n"))
  if match is None or match.group(2) or not match.group(3):
    return None
  name, rest = match.group(3), match.group(4)
  if name not in LINE_MAGICS or rest[:1] in ("=", ","):
    return None
  if name in bound or name in _BUILTINS or keyword.iskeyword(name):
    return None
  return Magic(row, row + 1, "")  # IPython drops the cell's indentation first


_BUILTINS = frozenset(dir(builtins))


def masked(lines: list[str], magic: Magic, value: str, comment: str = "#") -> list[str]:
  """``lines`` with the span replaced by Python of as many lines: ``prefix + value`` on the
  first (an expression statement, or the assignment's value), ``comment`` on the rest."""
  cover = [f"{magic.prefix}{value}\n"] + [f"{comment}\n"] * (magic.stop - magic.start - 1)
  return lines[:magic.start] + cover + lines[magic.stop:]


# ----- IPython's own transformer -----

@functools.cache  # a failed import is not retried for every cell
def _ipython_finder() -> Callable[[list[str]], list[Magic]] | None:
  try:
    from IPython.core import inputtransformer2  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  needed = ("TransformerManager", "TokenTransformBase", "make_tokens_by_line")
  if not all(hasattr(inputtransformer2, name) for name in needed):
    return None  # an IPython whose transformer is laid out otherwise: our rules
  return lambda lines: ipython_magics(lines, inputtransformer2)


def ipython_magics(lines: list[str], transformer: ModuleType) -> list[Magic]:
  """The spans IPython's ``TransformerManager`` transforms, one at a time as it does:
  a transform replaces its span by one line, so the span is what it took out."""
  manager = transformer.TransformerManager()
  work, found = list(lines), list[Magic]()
  while True:
    try:
      tokens = transformer.make_tokens_by_line(work)
    except SyntaxError:
      return found  # an unparsable cell: IPython raises here too
    candidates = [c for c in (cls.find(tokens) for cls in manager.token_transformers)
                  if c is not None]
    for candidate in sorted(candidates, key=transformer.TokenTransformBase.sortby):
      try:
        replaced = candidate.transform(work)
      except SyntaxError:
        continue
      stop = candidate.start_line + len(work) - len(replaced) + 1
      magic = Magic(candidate.start_line, stop, work[candidate.start_line][:candidate.start_col])
      found.append(magic)
      work = masked(work, magic, "_")
      break
    else:
      return found


# ----- the same rules without IPython -----

_ESCAPES = frozenset("!?%,;/")  # a logical line starting with one is IPython's
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")
_HELP_TARGET = re.compile(r"%{0,2}(?!\d)[\w*]+(?:\.(?!\d)[\w*]+|\[-?[0-9]+\])*\?\??$")
_HELP_PRIORITY, _OTHER_PRIORITY = 5, 10  # `%foo?` is help on a magic, not a magic call


def own_magics(lines: list[str]) -> list[Magic]:
  work, found = list(lines), []
  while (magic := _first_magic(work)) is not None:
    found.append(magic)
    work = masked(work, magic, "_")
  return found


def _first_magic(lines: list[str]) -> Magic | None:
  logical = _logical_lines(lines)
  # (line, column, priority, the span's stop or None where IPython refuses the transform)
  candidates: list[tuple[int, int, int, Callable[[], int | None]]] = []
  escaped = next(((t, i) for t in logical if (i := _after_indent(t)) is not None
                  and t[i].string in _ESCAPES), None)
  if escaped is not None:
    row, col = escaped[0][escaped[1]].start
    candidates.append((row - 1, col, _OTHER_PRIORITY, _escape_stop(lines, row - 1, col)))
  for escape in ("%", "!"):
    assigned = next(((t, i) for t in logical if (i := _assigned_escape(t, escape)) is not None),
                    None)
    if assigned is not None:
      row, col = assigned[0][assigned[1]].start
      candidates.append((row - 1, col, _OTHER_PRIORITY, _backslash_stop(lines, row - 1)))
  helped = next((t for t in logical if len(t) > 2 and t[-2].string == "?"), None)
  if helped is not None:
    (row, col), q_row = helped[_after_indent(helped) or 0].start, helped[-2].start[0]
    candidates.append((row - 1, col, _HELP_PRIORITY, _help_stop(lines, row - 1, col, q_row)))
  for row, col, _, stop in sorted(candidates, key=lambda c: c[:3]):
    end = stop()
    if end is not None:
      return Magic(row, end, lines[row][:col])
  return None


def _logical_lines(lines: list[str]) -> list[_Tokens]:
  """Tokens grouped by logical line: a line ends at NEWLINE, or at NL outside brackets
  (a blank or comment line); a tokenizer error ends the grouping there."""
  groups: list[_Tokens] = [[]]
  depth = 0
  try:
    for token in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
      groups[-1].append(token)
      if token.type == tokenize.NEWLINE or (token.type == tokenize.NL and depth <= 0):
        groups.append([])
      elif token.type == tokenize.OP and token.string in _OPEN:
        depth += 1
      elif token.type == tokenize.OP and token.string in _CLOSE and depth > 0:
        depth -= 1
  except (tokenize.TokenError, SyntaxError):
    pass  # an unterminated string or bracket: what came before still counts
  return [g for g in groups if g]


def _after_indent(tokens: _Tokens) -> int | None:
  return next((i for i, t in enumerate(tokens)
               if t.type not in (tokenize.INDENT, tokenize.DEDENT)), None)


def _assigned_escape(tokens: _Tokens, escape: str) -> int | None:
  """Index of ``escape`` as the value of the line's first top-level ``=``: ``a = %time f()``
  (a magic name must follow), ``a = !ls`` (the older tokenizer yields the space before
  ``!`` as a token of its own)."""
  depth = 0
  for i, token in enumerate(tokens):
    if token.string == "=" and depth == 0:
      if escape == "%":
        after = tokens[i + 1:i + 3]
        found = len(after) == 2 and after[0].string == "%" and after[1].type == tokenize.NAME
        return i + 1 if found else None
      j = i + 1
      while j < len(tokens) and tokens[j].type == tokenize.ERRORTOKEN and tokens[j].string.isspace():
        j += 1
      found = j < len(tokens) and tokens[j].string == "!"
      return j if found and not token.line.strip().startswith("=") else None
    if token.string in _OPEN:
      depth += 1
    elif token.string in _CLOSE and depth > 0:
      depth -= 1
  return None


def _backslash_stop(lines: list[str], start: int) -> Callable[[], int | None]:
  """A magic or shell line runs on over lines ending in a backslash."""
  def stop() -> int:
    end = start
    while end < len(lines) - 1 and lines[end].endswith("\\\n"):
      end += 1
    return end + 1
  return stop


def _escape_stop(lines: list[str], start: int, col: int) -> Callable[[], int | None]:
  """As ``_backslash_stop``; IPython refuses ``/`` (call with the rest as arguments)
  without a callable name right after it."""
  def stop() -> int | None:
    first = lines[start][col:]
    text = first.rstrip()[:-1] + " " if first.endswith("\\\n") else first.rstrip()
    if text.startswith("/") and text[1:2] in ("", " "):
      return None
    return _backslash_stop(lines, start)()
  return stop


def _help_stop(lines: list[str], start: int, col: int, q_row: int) -> Callable[[], int | None]:
  """``obj?`` spans up to its ``?``; IPython takes it only after a (dotted) name."""
  def stop() -> int | None:
    content = "".join(lines[start:q_row])[col:]
    return q_row if _HELP_TARGET.search(content) else None
  return stop
