"""Every security test that starts a sandbox runs on each sandbox backend (`sandbox_at` / `verifier_at`).

Read from the test files' syntax (ast), not by running them: a test function that starts a sandbox or
runs model code through a tool backend (directly, through a helper of its module, or through a fixture)
must take `sandbox_at` or `verifier_at` (directly or through a fixture), or be listed below with why not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
PLACES = frozenset({"sandbox_at", "verifier_at"})
# What starts a sandbox or runs model code: the tests' helpers (conftest.py), the backends' and pools'
# constructors, the unconfined local tool backend, and the CLI (whose env starts its own backend).
STARTERS = frozenset(
    {
        "sandbox_backend",
        "running_sandbox",
        "backend_config",
        "make_backend",
        "docker_backend",
        "local_backend",
        "SlotPool",
        "LocalWorkspace",
        "LocalToolBackend",
        "run_cli",
        "batch_runner.main",
    }
)

# Tests that start a sandbox on one backend only, on purpose. Keep this short: each needs its reason.
LOCAL_TOOLS = (
    "the unconfined local tool backend (`unconfined_tools`) exists on this machine only; its sandbox twin is beside it"
)
CLI_DEFAULT = "the CLI as a user runs it: no backend configured (local), or the refusals and opt-out of confinement"
TEXT = "the written groups' text and tokens, whatever backend ran the tools (the CLI's default)"
SUBTESTS = "local only: pytest 9 (the probe's reading of its subtest reports is the same on every backend)"
ALLOWED = {
    "test_local_backend.py::test_no_descendant_survives_the_command_or_its_timeout": LOCAL_TOOLS,
    "test_local_backend.py::test_search_path_cannot_become_a_flag_or_follow_a_link_out": LOCAL_TOOLS,
    "test_local_backend.py::test_tools_get_no_secrets_from_our_environment": LOCAL_TOOLS,
    "test_slot_resources.py::test_a_very_deep_tree_on_the_local_backend_is_the_models_error_not_the_runs": LOCAL_TOOLS,
    "test_host_escape.py::test_local_file_tools_cannot_be_raced_onto_host_files": LOCAL_TOOLS,
    "test_host_escape.py::test_local_fifo_read_returns_an_error_instead_of_hanging": LOCAL_TOOLS,
    "test_default_confinement.py::test_default_command_confines_model_code": CLI_DEFAULT,
    "test_default_confinement.py::test_batch_runner_confines_model_code_by_default": CLI_DEFAULT,
    "test_default_confinement.py::test_a_run_that_cannot_confine_refuses_in_one_line": CLI_DEFAULT,
    "test_default_confinement.py::test_batch_runner_refuses_local_tools_in_one_line": CLI_DEFAULT,
    "test_default_confinement.py::test_the_explicit_opt_out_runs_unconfined": CLI_DEFAULT,
    # About the written groups' text and tokens, which no backend changes; the CLI's default backend runs the tools.
    "test_input_hygiene.py::test_lone_surrogates_from_a_chat_model_become_u_fffd_and_the_group_is_written": TEXT,
    "test_input_hygiene.py::test_lone_surrogates_written_by_a_token_model_are_replaced_and_the_group_is_written": TEXT,
    "test_exports.py::test_the_html_view_shows_model_text_as_text": TEXT,
    "test_input_hygiene.py::test_a_rollout_whose_tokens_cannot_be_built_is_left_out_with_its_reason": TEXT,
    # Docker only: two containers whose slots must not share uids (locally one machine's pids keep them apart).
    "test_slot_exec_server.py::test_a_slot_in_one_container_cannot_use_up_the_process_limit_of_a_slot_in_another": (
        "docker only: uids across containers"
    ),
    # Docker only: the refusal of verify_in same_slot when slots run the instance's own image (locally there is none).
    "test_reward_integrity.py::test_verifying_in_the_agents_slot_is_refused_in_the_instances_image": (
        "docker only: the refusal on instance images"
    ),
    # Local only: pytest >= 9's own subtest reports, read by the probe the same way on every backend; the venv
    # with pytest 9 is this machine's (the docker images here have no pytest 9).
    "test_probe_subtests.py::test_passing_subtests_are_the_runners_own_reports": SUBTESTS,
    "test_probe_subtests.py::test_a_failing_subtest_fails_its_test": SUBTESTS,
    "test_probe_subtests.py::test_subtest_reports_forged_by_the_code_under_test_do_not_pass_a_test": SUBTESTS,
    # Local only: --env.deps.mode venv prepares on this machine; on docker the instance's image is the twin test.
    "test_reward_trust_root.py::test_shadowing_modules_score_zero_and_are_flagged_with_a_prepared_venv": (
        "local only: a prepared venv"
    ),
}


Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Module:
    name: str
    functions: dict[str, Function]
    fixtures: frozenset[str]
    imported: dict[str, tuple[str, str]]  # local name -> (module file, name) of `from tests.security.x import`


def _module(path: Path) -> Module:
    tree = ast.parse(path.read_text(), str(path))
    functions = {n.name: n for n in tree.body if isinstance(n, Function)}
    fixtures = frozenset(name for name, fn in functions.items() if any(_is_fixture(d) for d in fn.decorator_list))
    imported = {
        (alias.asname or alias.name): (f"{node.module.rsplit('.', 1)[1]}.py", alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.security.")
        for alias in node.names
    }
    return Module(path.name, functions, fixtures, imported)


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "fixture"


def _called(fn: ast.AST) -> set[str]:
    """Names of what `fn` calls: `f(...)` gives f; `a.f(...)` gives f and a.f."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                names.add(f.attr)
                if isinstance(f.value, ast.Name):
                    names.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Name):
                names.add(f.id)
    return names


def _params(fn: Function) -> set[str]:
    return {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}


class Index:
    """The functions and fixtures of tests/security: which start a sandbox, which take a place."""

    def __init__(self, here: Path = HERE) -> None:
        self.modules = {p.name: _module(p) for p in [here / "conftest.py", *sorted(here.glob("test_*.py"))]}
        self._starts: dict[tuple[str, str], bool] = {}
        self._placed: dict[tuple[str, str], bool] = {}

    def resolve(self, module: str, name: str, *, fixture: bool = False) -> tuple[str, str] | None:
        """Where `name`, as used in `module`, is defined (a fixture: there or in conftest.py)."""
        m = self.modules[module]
        if fixture:
            if name in m.fixtures:
                return module, name
            return ("conftest.py", name) if name in self.modules["conftest.py"].fixtures else None
        if name in m.functions:
            return module, name
        origin = m.imported.get(name)
        if origin is not None and origin[0] in self.modules and origin[1] in self.modules[origin[0]].functions:
            return origin
        return None

    def starts(self, module: str, name: str) -> bool:
        """The function `name` of `module` starts a sandbox: it calls a starter, or a function or takes a
        fixture that does."""
        key = (module, name)
        if key not in self._starts:
            self._starts[key] = False  # a cycle starts nothing by itself
            fn = self.modules[module].functions[name]
            calls, fixtures = _called(fn), _params(fn)
            found = bool(calls & STARTERS)
            for called in calls:
                where = self.resolve(module, called)
                found = found or (where is not None and self.starts(*where))
            for param in fixtures:
                where = self.resolve(module, param, fixture=True)
                found = found or (where is not None and self.starts(*where))
            self._starts[key] = found
        return self._starts[key]

    def placed(self, module: str, name: str) -> bool:
        """The function `name` of `module` takes `sandbox_at`/`verifier_at`, itself or through a fixture."""
        key = (module, name)
        if key not in self._placed:
            self._placed[key] = False
            params = _params(self.modules[module].functions[name])
            found = bool(params & PLACES)
            for param in params:
                where = self.resolve(module, param, fixture=True)
                found = found or (where is not None and self.placed(*where))
            self._placed[key] = found
        return self._placed[key]


def unplaced_tests(here: Path = HERE) -> list[str]:
    index = Index(here)
    return [
        f"{module}::{name}"
        for module, m in index.modules.items()
        for name in m.functions
        if name.startswith("test_") and index.starts(module, name) and not index.placed(module, name)
    ]


def test_every_test_that_starts_a_sandbox_runs_on_each_backend():
    missing = [t for t in unplaced_tests() if t not in ALLOWED]
    assert missing == [], (
        f"{len(missing)} test(s) start a sandbox on one backend only: take `sandbox_at` or `verifier_at` "
        f"(tests/security/conftest.py), or add each to ALLOWED with why: {missing}"
    )


def test_the_allow_list_names_only_tests_that_need_it():
    stale = sorted(set(ALLOWED) - set(unplaced_tests()))
    assert stale == [], f"allowed but no longer one-backend (or gone): remove them from ALLOWED: {stale}"


SYNTHETIC = {
    "conftest.py": """
import pytest
@pytest.fixture(params=["local", "docker"])
def sandbox_at(request): ...
@pytest.fixture
async def sandbox(sandbox_at):
    async with running_sandbox(sandbox_at) as b:
        yield b
@pytest.fixture
async def local_pool(tmp_path):
    yield make_backend(tmp_path)
def running_sandbox(where): ...
""",
    "test_a.py": """
from tests.security.test_b import helper_elsewhere
def _helper(where):
    return sandbox_backend(where)
async def test_direct_local(tmp_path): sandbox_backend(tmp_path)
async def test_direct_placed(sandbox_at): sandbox_backend(sandbox_at)
async def test_via_placed_fixture(sandbox): ...
async def test_via_local_fixture(local_pool): ...
async def test_via_helper(tmp_path): _helper(tmp_path)
async def test_via_imported_helper(tmp_path): await helper_elsewhere(tmp_path)
def test_via_the_cli(tmp_path): run_cli(object, "process")
def test_via_the_batch_runner(tmp_path): batch_runner.main([])
def test_local_tools(tmp_path): LocalWorkspace(tmp_path)
def test_starts_nothing(tmp_path): assert tmp_path
""",
    "test_b.py": """
async def helper_elsewhere(where):
    async with running_sandbox(where):
        pass
""",
}


def test_the_check_sees_each_way_a_test_starts_a_sandbox(tmp_path):
    """Against a check that finds nothing: each way a test can start a sandbox is seen, and a place taken
    through a fixture counts."""
    for name, source in SYNTHETIC.items():
        (tmp_path / name).write_text(source)
    assert sorted(unplaced_tests(tmp_path)) == [
        f"test_a.py::test_{name}"
        for name in (
            "direct_local",
            "local_tools",
            "via_helper",
            "via_imported_helper",
            "via_local_fixture",
            "via_the_batch_runner",
            "via_the_cli",
        )
    ]
