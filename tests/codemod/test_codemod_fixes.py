"""Cases found on real code: every site reported converted is rewritten (totals match the
diff), module-level partial aliases, nested-pmap detection by scope rather than by name,
multi-line arguments, and where imports land."""
import textwrap

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal

DECORATOR_ARGUMENT = '''\
import jax
import numpy as np


def transform_and_run(jax_transform):
  return lambda f: jax_transform(f)


@transform_and_run(jax_transform=lambda f: jax.pmap(f, 'i'))
def model(x):
  return jax.lax.psum(x, 'i') * x


def run():
  return model(np.arange(8 * 3, dtype=np.float32).reshape(8, 3))
'''


def _matches_legacy(source, name, **options):
  new, findings = rewrite(source, **options)
  assert "jax.pmap" not in new
  assert not [f for f in findings if f.severity.value == "ERROR"], findings
  assert_trees_equal(load(source, "legacy_" + name).run(), load(new, "ours_" + name).run())
  return new, findings


def test_pmap_inside_decorator_arguments_is_rewritten_and_counted_once():
  new, findings = _matches_legacy(DECORATOR_ARGUMENT, "decorator_argument")
  assert [f.message.split(" to ")[0] for f in findings] == ["pmap converted"]
  again, findings = rewrite(new)
  assert again == new and not findings


def test_cli_totals_match_the_diff(tmp_path, capsys):
  from codemod import pmap_to_shmap
  (tmp_path / "m.py").write_text(DECORATOR_ARGUMENT)
  assert pmap_to_shmap.main([str(tmp_path / "m.py")]) == 0
  out, err = capsys.readouterr()
  assert "1 pmap sites found, 1 converted, 0 reported" in err
  assert sum(l.startswith("-") and "jax.pmap" in l for l in out.splitlines()) == 1


def test_module_level_partial_alias_converts():
  source = textwrap.dedent('''\
      import functools
      import jax
      import numpy as np

      partial = functools.partial


      @partial(jax.pmap, axis_name="batch", in_axes=(0, None))
      def step(x, scale):
        return jax.lax.pmean(x, "batch") * scale


      def run():
        return step(np.arange(16, dtype=np.float32).reshape(8, 2), np.float32(3))
      ''')
  new, _ = _matches_legacy(source, "partial_alias")
  assert '@partial(shard_map, mesh=mesh, in_specs=(P("batch"), P()),' in new
  assert "@partial(per_device, in_axes=(0, None))" in new


def test_a_later_redefinition_does_not_make_a_site_nested():
  # As in a notebook: cell 2 pmaps cell 1's `step`; cell 3 redefines `step` with a pmap inside.
  source = textwrap.dedent('''\
      import jax
      import numpy as np


      def step(x):
        return x + 1

      g = jax.pmap(step, "i")
      first = g(np.zeros((8, 2), np.float32))


      def step(x):
        return jax.pmap(lambda y: y * 2, "j")(x)


      def run():
        return first, step(np.ones((8, 2), np.float32))
      ''')
  _, findings = _matches_legacy(source, "redefinition")
  assert [f.severity.value for f in findings] == ["INFO", "INFO"]


def test_a_pmap_in_the_body_of_the_def_that_reaches_the_site_is_still_reported():
  source = ("import jax\n\n\ndef step(x):\n  return x\n\n\ndef step(x):\n"
            "  return jax.pmap(lambda y: y, 'j')(x)\n\ng = jax.pmap(step, 'i')\n")
  new, findings = rewrite(source)
  assert new == source
  assert any("inside the body of a pmapped function" in f.message for f in findings)


def test_multi_line_arguments_keep_their_relative_indentation():
  source = ("import jax\n\ng = jax.pmap(lambda x: (x +\n"
            "                        1), 'i')\n")
  new, _ = rewrite(source)
  lines = new.splitlines()
  head = next(l for l in lines if "lambda x: (x +" in l)
  tail = lines[lines.index(head) + 1]
  assert tail.index("1)") == head.index("(x +") + 1


def test_imports_are_added_with_the_leading_imports_not_mid_module():
  source = ('"""Doc."""\nimport jax\n\nX = 1\nimport numpy as np\n\n\n'
            'def f(x):\n  return x\n\n\ng = jax.pmap(f)\n')
  new, _ = rewrite(source)
  head = new.split("X = 1")[0]
  for line in ("from jax.experimental.shard_map import shard_map",
               "from pmap_shard_map import per_device, placed_on",
               "from jax.sharding import PartitionSpec as P"):
    assert line in head
  assert new.startswith('"""Doc."""\nimport jax\nfrom jax.experimental.shard_map import shard_map\n')


COMPILED_NAMES = '''\
import functools
import jax
import numpy as np


def train_step(x, scale=1.0):
  return x * scale


class Model:

  def apply(self, x):
    return x + 1.0


double = lambda x: x * 2.0


@functools.partial(jax.pmap, axis_name="batch")
def decorated_step(x):
  return x


FUNS = {
    "partial": functools.partial(train_step, scale=2.0),
    "partial_of_partial": functools.partial(functools.partial(train_step), scale=3.0),
}
SITES = {
    "function": jax.pmap(train_step, axis_name="batch"),
    "partial": jax.pmap(functools.partial(train_step, scale=2.0), axis_name="batch"),
    "partial_of_partial": jax.pmap(functools.partial(functools.partial(train_step), scale=3.0)),
    "lambda": jax.pmap(double),
    "method": jax.pmap(Model().apply),
    "decorated": decorated_step,
}
'''


def _module_name(lowered) -> str:
  first = next(l for l in lowered.as_text().splitlines() if l.startswith("module @"))
  return first.split()[1][1:]


def test_converted_sites_compile_under_the_users_function_name():
  # Legacy pmap names its program pmap_<name>; a converted site is a jax.jit, so it must be
  # jit_<the same name>. For a partial legacy pmap 0.6.0 shows no name at all
  # (pmap__unnamed_wrapped_function_, and so does jax.jit of a partial); the converted site
  # names it after the function the partial wraps, as jax_log_compiles does.
  import functools

  import jax
  import numpy as np
  new, findings = rewrite(COMPILED_NAMES)
  assert "jax.pmap" not in new, new
  legacy = load(COMPILED_NAMES, "legacy_compiled_names").SITES
  ours_module = load(new, "ours_compiled_names")
  ours = ours_module.SITES
  x = np.ones((jax.local_device_count(), 3), np.float32)
  for case, site in ours.items():
    got = _module_name(site.lower(x))
    legacy_name = _module_name(legacy[case].lower(x))
    assert legacy_name.startswith("pmap_"), legacy_name
    if "unnamed" in legacy_name:
      wrapped = ours_module.FUNS[case]
      while isinstance(wrapped, functools.partial):
        wrapped = wrapped.func
      expected = "jit_" + wrapped.__name__
    else:
      expected = "jit_" + legacy_name[len("pmap_"):]
    assert got == expected, (case, got, expected)
