"""Report entries: one ``file:line:col SEVERITY message`` line per finding, plus totals.

The command reports through libcst's context: each finding is a warning
``line:col SEVERITY message`` (what ``python -m libcst.tool codemod`` prints), and the
site counts sit in ``context.scratch[SITES_KEY]``; the project CLI reads both back.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

SITES_KEY = "pmap_to_shmap.sites"  # (found, converted) for the file just transformed
_WARNING_RE = re.compile(r"(\d+):(\d+) (INFO|WARNING|ERROR) (.*)", re.S)


class Severity(str, enum.Enum):
  INFO = "INFO"        # converted, or a pattern that keeps working as it is
  WARNING = "WARNING"  # works, but needs a look (removed APIs, multi-process code)
  ERROR = "ERROR"      # left unchanged: not convertible exactly, or the file failed


@dataclass(frozen=True)
class Finding:
  line: int
  column: int
  severity: Severity
  message: str

  def format(self, path: str) -> str:
    return f"{path}:{self.format_warning()}"

  def format_warning(self) -> str:
    return f"{self.line}:{self.column} {self.severity.value} {self.message}"

  @classmethod
  def from_warning(cls, text: str) -> Finding:
    match = _WARNING_RE.fullmatch(text)
    if match is None:  # a warning from libcst itself or another command
      return cls(1, 1, Severity.WARNING, text)
    return cls(int(match.group(1)), int(match.group(2)), Severity(match.group(3)),
               match.group(4))


@dataclass
class FileResult:
  """What the codemod did to one file."""
  path: str
  findings: list[Finding] = field(default_factory=list)
  sites_found: int = 0
  sites_converted: int = 0
  changed: bool = False
  new_source: bytes | None = None
  diff: str = ""
  internal_error: bool = False
  io_error: bool = False  # the file could not be read or written
  support_flags: frozenset[str] = frozenset()  # support_module.FEATURES its new code needs
  # (root, dotted name) of the support module the file imports, and the names it imports
  # from it after the run (this run's and an earlier run's)
  support_key: tuple[str, str] | None = None
  support_imports: frozenset[str] = frozenset()

  def not_written(self, reason: str) -> None:
    """The rewrite did not land: the file is unchanged, so no site in it was converted.

    INFO findings describe the rewrite (or advise on its result) and go; warnings and
    errors about the original code stay.
    """
    self.findings = [f for f in self.findings if f.severity is not Severity.INFO]
    self.findings.append(Finding(1, 1, Severity.ERROR, f"{reason}; the file is left "
                                 f"unchanged, {self.sites_converted} sites not converted"))
    self.changed, self.new_source, self.diff = False, None, ""
    self.sites_converted = 0
    self.io_error = True


@dataclass
class Totals:
  files_scanned: int = 0
  files_changed: int = 0
  sites_found: int = 0
  sites_converted: int = 0
  errors: int = 0
  warnings: int = 0
  internal_errors: int = 0
  io_errors: int = 0  # files or directories that could not be read, listed or written

  def add(self, result: FileResult) -> None:
    self.files_scanned += 1
    self.files_changed += int(result.changed)
    self.sites_found += result.sites_found
    self.sites_converted += result.sites_converted
    self.errors += sum(f.severity is Severity.ERROR for f in result.findings)
    self.warnings += sum(f.severity is Severity.WARNING for f in result.findings)
    self.internal_errors += int(result.internal_error)
    self.io_errors += int(result.io_error)

  def add_notice(self, finding: Finding, failed: bool) -> None:
    """A finding about a path that was not scanned (a symlink left alone, a temp file)."""
    self.errors += finding.severity is Severity.ERROR
    self.warnings += finding.severity is Severity.WARNING
    self.io_errors += failed

  def format(self) -> str:
    reported = self.sites_found - self.sites_converted
    return (f"{self.files_scanned} files scanned, {self.files_changed} changed; "
            f"{self.sites_found} pmap sites found, {self.sites_converted} converted, "
            f"{reported} reported; {self.errors} errors, {self.warnings} warnings"
            + (f"; {self.io_errors} paths could not be read or written" if self.io_errors else ""))
