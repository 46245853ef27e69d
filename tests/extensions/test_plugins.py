"""Plugins in this process: finding them (the test distribution's `.dist-info` on `sys.path`, read by
importlib.metadata as an installed one), the start-up errors the settings can cause (an unknown name lists the
installed ones), the guards (a raise, a hang, a block of the loop measured with a clock moved by hand, a wrong
answer: each counted, its default applied) and the publish hooks' lanes (a publisher's order kept through late
answers, a long lane holds its publisher, rewrites applied and checked)."""

from __future__ import annotations

import asyncio
import importlib.metadata
from pathlib import Path
from typing import Any

import pytest

from tests.extensions.plugin_dist import lay_out
from tests.waiting import until
from tidewire.errors import ConfigError
from tidewire.extensions.authentication import AuthRequest, Outcome
from tidewire.extensions.hooks import AllowAll, ClientInfo, Narrowed, SubscribeAccess
from tidewire.extensions.plugin_guard import Guard, GuardedAuthenticator, GuardedAuthorizer, GuardedHook, PluginErrors
from tidewire.extensions.plugins import (
    ALLOW,
    AUTH_GROUP,
    PUBLISH_HOOK_GROUP,
    SINK_GROUP,
    Action,
    PluginCatalog,
    PublishDecision,
    deny,
    rewrite,
)
from tidewire.gateway.config import Settings, read_config_file
from tidewire.gateway.core.publish_hooks import LANE_HOLD, PublishHooks
from tidewire.gateway.security import BUILTINS, Security
from tidewire.store.base import Message
from tidewire.store.properties import Properties

ALICE = ClientInfo("c1", "alice")


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lay_out(tmp_path_factory.mktemp("plugins"))


@pytest.fixture
def installed(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test distribution as if installed (on sys.path: its module imports, its entry points are found)."""
    monkeypatch.syspath_prepend(str(plugin_dir))
    return plugin_dir


# --- finding plugins --------------------------------------------------------------------------------------------
def test_entry_points_are_found_after_the_builtins(installed: Path) -> None:
    catalog = PluginCatalog(BUILTINS)
    assert catalog.installed(AUTH_GROUP) == ["file", "jwt", "http", "dynsec", "testauth"]
    assert catalog.installed(PUBLISH_HOOK_GROUP) == ["stricthook", "testhook"]
    assert catalog.installed(SINK_GROUP) == ["testsink"]  # declared, not wired
    hook = catalog.create(PUBLISH_HOOK_GROUP, "testhook", {"prefix": "x/"})
    assert type(hook).__name__ == "TestHook" and hook.prefix == "x/"  # type: ignore[attr-defined]


def test_an_unknown_name_is_an_error_naming_the_installed_ones(installed: Path) -> None:
    with pytest.raises(ConfigError, match=r"no authentication source named 'ldap' .*installed: file, jwt, http, "
                                          r"dynsec, testauth"):
        Security.build(Settings(auth_chain=["file", "ldap"]))
    with pytest.raises(ConfigError, match=r"no publish hook named 'nope'.*installed: stricthook, testhook"):
        Security.build(Settings(publish_hooks=["nope"]))


def test_a_factory_refusing_its_options_stops_the_start(installed: Path) -> None:
    with pytest.raises(ConfigError, match=r"authentication source 'testauth' \(tidewire_test_plugin:make_authenticator"
                                          r" from tidewire-test-plugin 0.1\) refused its options: ValueError"):
        Security.build(Settings(auth_chain=["testauth"], plugin_options={"testauth": {"users": ["a"]}}))


class NotAnAuthorizer:
    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return True


def make_not_an_authorizer(options: dict[str, Any]) -> NotAnAuthorizer:
    return NotAnAuthorizer()


def entry_points(*points: tuple[str, str, str]) -> Any:
    found = [importlib.metadata.EntryPoint(name, value, group) for name, value, group in points]
    return lambda group: [ep for ep in found if ep.group == group]


def test_what_a_plugin_makes_must_have_its_groups_methods() -> None:
    me = "tests.extensions.test_plugins"
    catalog = PluginCatalog(BUILTINS, entry_points(
        ("half", f"{me}:make_not_an_authorizer", "tidewire.authz"), ("gone", "no_such_module:make", "tidewire.authz"),
        ("twice", f"{me}:make_not_an_authorizer", "tidewire.authz"), ("twice", f"{me}:other", "tidewire.authz"),
        ("acl", f"{me}:make_not_an_authorizer", "tidewire.authz")))
    with pytest.raises(ConfigError, match="made a NotAnAuthorizer, which has no subscribe_access, allow_read"):
        catalog.create("tidewire.authz", "half")
    with pytest.raises(ConfigError, match=r"'gone' .* cannot be loaded: ModuleNotFoundError"):
        catalog.create("tidewire.authz", "gone")
    with pytest.raises(ConfigError, match="'twice' is declared by more than one distribution"):
        catalog.create("tidewire.authz", "twice")
    with pytest.raises(ConfigError, match="'acl' is built in"):
        catalog.create("tidewire.authz", "acl")
    assert catalog.shadowed("tidewire.authz") == ["acl (an unknown distribution)"]
    assert catalog.installed("tidewire.authz") == ["acl", "gone", "half", "twice"]


def test_settings_that_name_plugins_wrongly_stop_the_start(installed: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plugin_options for typo, which is no plugin in use"):
        Security.build(Settings(publish_hooks=["testhook"], plugin_options={"typo": {}}))
    with pytest.raises(ConfigError, match=r"plugin_timeouts for file, .*\(file: built in"):
        Security.build(Settings(plugin_timeouts={"file": 2}))
    with pytest.raises(ConfigError, match="testauth is a auth: its default is 'ignore' or 'deny', not 'allow'"):
        Security.build(Settings(auth_chain=["testauth"], plugin_defaults={"testauth": "allow"}))
    with pytest.raises(ConfigError, match="publish_hooks names 'testhook' twice"):
        Security.build(Settings(publish_hooks=["testhook", "testhook"]))
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite #\n")
    with pytest.raises(ValueError, match="acl_file is set but `acl` is not in authorizers"):
        Security.build(Settings(acl_file=acl, authorizers=["testauthz"]))
    with pytest.raises(ValueError, match="timeout must be over 0 s: testhook"):
        Settings(plugin_timeouts={"testhook": 0})


def test_the_plugins_table_of_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "tidewire.toml"
    path.write_text('[plugins]\npublish_hooks = ["h"]\nplugin_timeout = 0.5\n[plugins.defaults]\nh = "deny"\n'
                    '[plugins.timeouts]\nh = 0.2\n[plugins.options.h]\nprefix = "p/"\nlimits = { n = 3 }\n')
    settings = Settings(**read_config_file(path))
    assert settings.publish_hooks == ["h"] and settings.plugin_timeout == 0.5
    assert settings.plugin_defaults == {"h": "deny"} and settings.plugin_timeouts == {"h": 0.2}
    assert settings.plugin_options == {"h": {"prefix": "p/", "limits": {"n": 3}}}


# --- guards -----------------------------------------------------------------------------------------------------
class Misbehaving:
    """Each call does what `self.mode` says."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.mode = "ok"
        self.clock = clock
        self.answer: Any = ALLOW

    async def _act(self) -> Any:
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "block":  # blocks the loop: the clock moves on while nothing else runs
            assert self.clock is not None
            self.clock.now += 5
        return self.answer

    async def on_publish(self, client: ClientInfo, message: Message) -> Any:
        return await self._act()

    async def authenticate(self, request: AuthRequest) -> Any:
        return await self._act()

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "block":
            assert self.clock is not None
            self.clock.now += 5
        return self.answer

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        return self.answer

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        return True


def message(topic: str = "t/a", payload: bytes = b"p") -> Message:
    return Message(topic, payload, 1, False, b"", 1000, 0, "c1")


async def test_a_hook_that_raises_hangs_blocks_or_answers_nonsense_gets_its_default() -> None:
    clock = ManualClock()
    errors = PluginErrors()
    plugin = Misbehaving(clock)
    lenient = GuardedHook(plugin, Guard("h", 0.05, "allow", errors, clock))
    strict = GuardedHook(plugin, Guard("s", 0.05, "deny", errors, clock))
    assert await lenient.on_publish(ALICE, message()) is ALLOW
    for mode in ("raise", "hang", "block"):
        plugin.mode = mode
        assert (await lenient.on_publish(ALICE, message())).action is Action.ALLOW
        assert (await strict.on_publish(ALICE, message())).action is Action.DENY
    plugin.mode, plugin.answer = "ok", "allow"
    assert (await strict.on_publish(ALICE, message())).action is Action.DENY
    assert errors.counts == {("h", "error"): 1, ("h", "timeout"): 2, ("s", "error"): 1, ("s", "timeout"): 2,
                             ("s", "invalid"): 1}


async def test_an_auth_plugin_failing_is_ignored_or_denies_as_configured() -> None:
    clock = ManualClock()
    errors = PluginErrors()
    plugin = Misbehaving(clock)
    plugin.mode = "raise"
    request = AuthRequest("c1", "alice", b"pw")
    ignoring = GuardedAuthenticator(plugin, Guard("a", 0.05, "ignore", errors, clock))  # type: ignore[arg-type]
    denying = GuardedAuthenticator(plugin, Guard("b", 0.05, "deny", errors, clock))  # type: ignore[arg-type]
    assert (await ignoring.authenticate(request)).outcome is Outcome.IGNORE
    assert (await denying.authenticate(request)).outcome is Outcome.DENY
    plugin.mode = "ok"  # answers ALLOW, a PublishDecision: not an AuthDecision
    assert (await ignoring.authenticate(request)).outcome is Outcome.IGNORE
    assert errors.counts == {("a", "error"): 1, ("b", "error"): 1, ("a", "invalid"): 1}


def test_an_authorizer_plugin_narrows_and_fails_to_its_default() -> None:
    clock = ManualClock()
    errors = PluginErrors()
    plugin = Misbehaving(clock)
    plugin.answer = True
    guarded = GuardedAuthorizer(plugin, Guard("z", 0.05, "deny", errors, clock))
    node = Narrowed(AllowAll(), [guarded])
    assert node.allow_publish(ALICE, "t")
    plugin.mode = "raise"
    assert not node.allow_publish(ALICE, "t")
    plugin.mode = "block"
    assert not node.allow_publish(ALICE, "t")  # answered after its timeout: discarded
    assert node.allow_publish(ClientInfo("root", "root", superuser=True), "t")  # superusers pass, unasked
    plugin.mode, plugin.answer = "ok", SubscribeAccess.FILTERED
    assert node.subscribe_access(ALICE, "t/#") is SubscribeAccess.FILTERED
    plugin.answer = 7
    assert node.subscribe_access(ALICE, "t/#") is SubscribeAccess.DENIED
    assert errors.counts == {("z", "error"): 1, ("z", "timeout"): 1, ("z", "invalid"): 1}


# --- the hooks' lanes -------------------------------------------------------------------------------------------
class Recorder:
    """A publisher and the node's publish, as seen by `PublishHooks`."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, Any]] = []
        self.refused: list[tuple[str, Any, str]] = []
        self.holds: list[bool] = []
        self.drops: list[str] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def publish(self, message: Message, sink: Any, token: Any) -> None:
        self.published.append((message.topic, message.payload, token))

    def publish_refused(self, message: Message, token: Any, reason: str) -> None:
        self.refused.append((message.topic, token, reason))

    def hold_publishes(self, held: bool) -> None:
        self.holds.append(held)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Scripted:
    """A hook answering per topic, late by a different amount each time."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.calls = 0

    async def on_publish(self, client: ClientInfo, message: Message) -> PublishDecision:
        self.calls += 1
        await self.gate.wait()
        for _ in range((self.calls * 7) % 5):  # a different number of loop turns per call
            await asyncio.sleep(0)
        verb = message.topic.split("/")[0]
        if verb == "deny":
            return deny("no")
        if verb == "move":
            return rewrite(topic="moved/" + message.topic, properties=Properties(content_type="text/plain",
                                                                                 expiry_interval=60))
        if verb == "sys":
            return rewrite(topic="$SYS/x")
        return ALLOW


def hooks_for(recorder: Recorder, hook: Any, settings: Settings | None = None) -> PublishHooks:
    guarded = GuardedHook(hook, Guard("scripted", 5.0, "allow", PluginErrors(), ManualClock()))
    return PublishHooks([guarded], settings or Settings(), AllowAll(), recorder.publish, recorder.drops.append,
                        recorder.spawn)


async def test_a_publishers_messages_keep_their_order_through_late_hooks() -> None:
    recorder = Recorder()
    hooks = hooks_for(recorder, Scripted())
    other = Recorder()
    topics = [("deny" if i % 7 == 3 else "t") + f"/{i}" for i in range(60)]
    for i, topic in enumerate(topics):
        hooks.submit(recorder, ALICE, message(topic), None, ("one", i))
        hooks.submit(other, ALICE, message(topic), None, ("two", i))  # another publisher, its own lane
    await until(lambda: not recorder.tasks)
    allowed = [i for i, t in enumerate(topics) if t.startswith("t/")]
    for lane in ("one", "two"):  # `recorder.publish` is the node's: both lanes end there
        assert [i for name, i in (token for _, _, token in recorder.published) if name == lane] == allowed
    assert [i for _, (_, i), _ in recorder.refused] == [i for i, t in enumerate(topics) if t.startswith("deny")]
    assert [i for _, (_, i), _ in other.refused] == [i for i, t in enumerate(topics) if t.startswith("deny")]
    assert recorder.drops.count("hook_denied") == 2 * len(recorder.refused)
    assert hooks.waiting == 0


async def test_a_long_lane_holds_its_publisher_until_it_is_down_to_half() -> None:
    recorder = Recorder()
    hook = Scripted()
    hook.gate.clear()
    hooks = hooks_for(recorder, hook)
    for i in range(LANE_HOLD + 10):
        hooks.submit(recorder, ALICE, message(f"t/{i}"), None, i)
    assert recorder.holds == [True]
    hook.gate.set()
    await until(lambda: not recorder.tasks)
    assert recorder.holds == [True, False]
    assert len(recorder.published) == LANE_HOLD + 10


async def test_rewrites_are_applied_and_the_acl_decides_again() -> None:
    recorder = Recorder()
    hooks = hooks_for(recorder, Scripted())
    moved = message("move/a")
    assert await hooks.check(ALICE, moved) is None
    assert moved.topic == "moved/move/a"
    assert Properties.from_block(moved.properties).content_type == "text/plain"
    assert moved.expires_at_ms == moved.timestamp_ms + 60_000
    assert await hooks.check(ALICE, message("sys/a")) == "not authorized"  # `$SYS` is the broker's own
    assert recorder.drops == ["not_authorized"]
