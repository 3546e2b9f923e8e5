"""New imports join their isort section (standard library, third party, first party,
relative) in the file's order, checked against ruff's own isort rule: a header that
passes ``ruff check --select I`` before the rewrite passes it after."""
from __future__ import annotations

import os
import subprocess
import sys

import libcst as cst
import pytest

from codemod import imports
from codemod_testing import rewrite

RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")
FIRST_PARTY = 'lint.isort.known-first-party = ["mypkg", "pmap_shard_map", "flax"]'
GOOGLE = "lint.isort.force-sort-within-sections = true"

W = imports.Wanted
P_SPEC = W("jax.sharding", "PartitionSpec", "P")
SHARD_MAP = W("jax.experimental.shard_map", "shard_map")
SUPPORT = W("pmap_shard_map", "on_pmap_mesh")
# What a file importing jax gets for an old-form site (the import machinery is the same
# for the plain form's names).
CONVERTED = [W("functools"), P_SPEC, SHARD_MAP, SUPPORT]

# name: (header, wanted, extra ruff config, the header after)
CASES = {
    "sorted_sections": ('''\
"""Train."""
import os
import sys

import jax
import numpy as np

from mypkg import util

x = 1
''', CONVERTED, (), '''\
"""Train."""
import functools
import os
import sys

import jax
import numpy as np
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from mypkg import util
from pmap_shard_map import on_pmap_mesh

x = 1
'''),
    # Google style: ``import m`` and ``from m import x`` sorted together by module.
    "google_style": ('''\
import os
from typing import Any

from absl import app
import jax
from jax import numpy as jnp
import numpy as np

from mypkg import util

x = 1
''', CONVERTED, (GOOGLE,), '''\
import functools
import os
from typing import Any

from absl import app
import jax
from jax import numpy as jnp
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P
import numpy as np

from mypkg import util
from pmap_shard_map import on_pmap_mesh

x = 1
'''),
    # Only third party: the standard library and first party sections are started.
    "only_numpy": ('''\
import numpy as np

x = 1
''', [W("jax"), *CONVERTED], (), '''\
import functools

import jax
import numpy as np
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from pmap_shard_map import on_pmap_mesh

x = 1
'''),
    "docstring_and_future": ('''\
"""Doc."""

from __future__ import annotations

import jax

x = 1
''', CONVERTED, (), '''\
"""Doc."""

from __future__ import annotations

import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from pmap_shard_map import on_pmap_mesh

x = 1
'''),
    # ``mypkg`` is first party by its block after the third-party one: the support
    # module joins it rather than starting a block of its own.
    "first_party_block": ('''\
import jax

from mypkg import util
from mypkg.sub import thing

x = 1
''', CONVERTED, (), '''\
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from mypkg import util
from mypkg.sub import thing
from pmap_shard_map import on_pmap_mesh

x = 1
'''),
    # A file inside a package imports the support module relatively: furthest first.
    "relative": ('''\
import jax

from . import utils

x = 1
''', [*CONVERTED[:3], W("_pmap_shard_map", "on_pmap_mesh", relative=2)], (), '''\
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from .._pmap_shard_map import on_pmap_mesh
from . import utils

x = 1
'''),
    # flax's own files: flax is first party, the support module inside it too.
    "flax_package": ('''\
import jax

from flax import linen as nn

x = 1
''', [*CONVERTED[:3], W("flax._pmap_shard_map", "on_pmap_mesh")], (), '''\
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from flax import linen as nn
from flax._pmap_shard_map import on_pmap_mesh

x = 1
'''),
    # Comments stay on their statements; a section heading stays above its statement.
    "comments": ('''\
import os  # noqa: F401

# Accelerators.
import jax
import numpy as np  # numerics

x = 1
''', [W("absl"), *CONVERTED], (), '''\
import functools
import os  # noqa: F401

import absl

# Accelerators.
import jax
import numpy as np  # numerics
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from pmap_shard_map import on_pmap_mesh

x = 1
'''),
    # Names join the file's import of the support module.
    "joined": ('''\
import functools

import jax

from pmap_shard_map import device_put_replicated

x = 1
''', CONVERTED[1:], (), '''\
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from pmap_shard_map import device_put_replicated, on_pmap_mesh

x = 1
'''),
    "no_imports": ('''\
"""Doc."""

x = 1
''', [W("jax"), *CONVERTED], (), '''\
"""Doc."""
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from pmap_shard_map import on_pmap_mesh

x = 1
'''),
}


def _isort_clean(code: str, config: tuple[str, ...]) -> bool:
  args = [RUFF, "check", "--isolated", "--no-cache", "--select", "I", "--config", FIRST_PARTY]
  for option in config:
    args += ["--config", option]
  run = subprocess.run([*args, "--stdin-filename", "x.py", "-"], input=code, text=True,
                       capture_output=True, timeout=60, check=False)
  assert run.returncode in (0, 1), run.stderr
  return run.returncode == 0


def _add(code: str, wanted: list[imports.Wanted]) -> str:
  return imports.add(cst.parse_module(code), wanted).code


@pytest.mark.parametrize("name", sorted(CASES))
def test_sorted_file_stays_sorted(name):
  before, wanted, config, expected = CASES[name]
  assert _isort_clean(before, config)
  after = _add(before, wanted)
  assert after == expected
  assert _isort_clean(after, config)


def test_unsorted_file_gets_imports_next_to_their_group_without_reordering():
  before = "import numpy as np\nimport jax\nimport os\n\nx = 1\n"
  assert not _isort_clean(before, ())
  after = _add(before, CONVERTED)
  assert after == '''\
import numpy as np
import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P
import functools
import os

from pmap_shard_map import on_pmap_mesh

x = 1
'''


def test_in_an_unsorted_section_imports_follow_the_same_package_s_last_import():
  # flax's examples/imagenet/train.py: `import jax.numpy as jnp` before `from jax import
  # random` leaves the block unsorted; the new jax imports go with jax's, not after tfds.
  before = ("import flax\nimport jax\nfrom jax import lax\nimport jax.numpy as jnp\n"
            "from jax import random\nimport optax\nimport tensorflow_datasets as tfds\n\n"
            "x = 1\n")
  assert not _isort_clean(before, (GOOGLE,))
  after = _add(before, [P_SPEC, SHARD_MAP])
  assert after == before.replace(
      "from jax import random\n", "from jax import random\nfrom jax.experimental.shard_map "
      "import shard_map\nfrom jax.sharding import PartitionSpec as P\n"), after


def test_a_file_with_one_name_per_from_import_gets_one_name_per_line():
  # haiku's examples/imagenet/train.py (Google style, no sorter configured): `from absl
  # import app` / `from absl import flags`; typing's multi-name imports are exempt.
  before = ("from collections.abc import Iterable, Mapping\n\nfrom absl import app\n"
            "from absl import flags\nimport jax\n\nx = 1\n")
  after = _add(before, [W("pmap_shard_map", "per_device"), W("pmap_shard_map", "placed_on")])
  assert "from pmap_shard_map import per_device\nfrom pmap_shard_map import placed_on\n" in after
  grouped = _add(before.replace("from absl import flags\n", ""),
                 [W("pmap_shard_map", "per_device"), W("pmap_shard_map", "placed_on")])
  assert "from pmap_shard_map import per_device, placed_on\n" in grouped, grouped


def test_imports_after_setup_code_join_the_run_holding_jax():
  setup = 'import os\n\nos.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"\n\n'
  after = _add(setup + "import functools\nimport jax\n\nx = 1\n", CONVERTED[1:])
  assert after == setup + '''\
import functools
import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

from pmap_shard_map import on_pmap_mesh

x = 1
'''


def test_first_party_given_by_the_caller():
  before = "import mylib\n\nx = 1\n"
  assert _add(before, [P_SPEC]) == (
      "import mylib\nfrom jax.sharding import PartitionSpec as P\n\nx = 1\n")
  after = imports.add(cst.parse_module(before), [P_SPEC], first_party=frozenset({"mylib"})).code
  assert after == "from jax.sharding import PartitionSpec as P\n\nimport mylib\n\nx = 1\n"


def test_notebook_cell_marker_stays_above_the_new_imports():
  # A later cell's imports: nothing goes into the cell before (above its marker).
  before = "x = 1\n# pmap-to-shmap:cell 1\nimport jax\n"
  after = _add(before, [W("functools")])
  assert after == "x = 1\n# pmap-to-shmap:cell 1\nimport functools\n\nimport jax\n"


def test_converted_file_passes_isort():
  before = '''\
"""Train."""
import os

import jax
import numpy as np

from mypkg import util

nested = jax.pmap(jax.pmap(lambda v: v * 2, axis_name="j"), axis_name="i")
'''
  assert _isort_clean(before, ())
  for target in ("experimental", "jax"):
    after, _ = rewrite(before, target=target)
    # functools.partial (the old form's, for nested pmaps) joins the standard
    # library's group; the support module the first-party one.
    assert "jax.pmap" not in after and "import functools\nimport os\n" in after
    assert ("from mypkg import util\n"
            "from pmap_shard_map import host_local_io, on_pmap_mesh\n") in after
    assert _isort_clean(after, ())


def test_first_party_module_in_a_third_party_block_stays_in_that_block():
  # Google style where the file's sorter did not know the package (jaxline's tests): the
  # package's imports sit among the third-party ones, and so do the new ones.
  before = '''\
import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
from jaxline import experiment
from jaxline import utils
import numpy as np

x = 1
'''
  wanted = [P_SPEC, SHARD_MAP, W("jaxline._pmap_shard_map", "placed_on")]
  after = imports.add(cst.parse_module(before), wanted, first_party=frozenset({"jaxline"})).code
  assert after == '''\
import functools

from absl.testing import absltest
import jax
from jax.experimental.shard_map import shard_map
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxline import experiment
from jaxline import utils
from jaxline._pmap_shard_map import placed_on
import numpy as np

x = 1
'''
  for code in (before, after):
    run = subprocess.run(
        [RUFF, "check", "--isolated", "--no-cache", "--select", "I", "--config", GOOGLE,
         "--config", "lint.isort.force-single-line = true",
         "--stdin-filename", "x.py", "-"],
        input=code, text=True, capture_output=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout
