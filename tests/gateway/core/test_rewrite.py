"""Topic rewrite rules (`gateway.core.rewrite`): order, groups, client placeholders, prefixes kept, invalid
results kept out."""

from __future__ import annotations

from tidewire.gateway.config import TopicRewriteRule
from tidewire.gateway.core.rewrite import Rewritten, TopicRewriter


def rules(*specs: tuple[str, str, str, str]) -> TopicRewriter:
    return TopicRewriter([TopicRewriteRule(action=a, source_topic=s, re=r, dest_topic=d)  # type: ignore[arg-type]
                          for a, s, r, d in specs])


def test_first_matching_source_decides_with_groups_and_client_names() -> None:
    rw = rules(("publish", "x/#", r"^x/(\w+)/(\w+)$", "y/$2/$1"), ("all", "x/#", "^x/(.+)$", "never/$1"),
               ("all", "u/+", "^u/(.+)$", "users/${username}/${clientid}/$1"))
    assert rw.publish("x/a/b", "c1", None) == Rewritten("y/b/a")
    assert rw.publish("x/a", "c1", None) is None  # the first rule's source matched, its regex did not: as it is
    assert rw.subscribe("x/#", "c1", None) == Rewritten("never/#")  # the publish-only rule is skipped
    assert rw.publish("u/t", "c1", "alice") == Rewritten("users/alice/c1/t")
    assert rw.publish("other", "c1", None) is None


def test_prefixes_kept_and_invalid_results_refused() -> None:
    rw = rules(("subscribe", "a/#", "^a/(.*)$", "b/$1"), ("publish", "p/+", "^p/(.*)$", "q/+/$1"))
    assert rw.subscribe("$share/g/a/+", "c", None) == Rewritten("$share/g/b/+")
    assert rw.subscribe("$exclusive/a/x", "c", None) == Rewritten("$exclusive/b/x")
    assert rw.publish("p/1", "c", None) == Rewritten("p/1", invalid=True)  # a wildcard in a topic name
    assert not TopicRewriter([]).active
