"""Topic and namespace name parsing: the forms accepted and the path-like names refused."""

from __future__ import annotations

import pytest

from tieredcore.errors import ValidationError
from tieredcore.names import NamespaceName, TopicName, decode_local_name, encode_local_name


@pytest.mark.parametrize(
    "text",
    [
        "persistent://tenant/ns/topic",
        "tenant/ns/topic",
        "tenant/ns/persistent/topic",
    ],
)
def test_three_forms_are_the_same_topic(text):
    t = TopicName.parse(text)
    assert (t.tenant, t.namespace, t.local_name) == ("tenant", "ns", "topic")
    assert t.namespace_name == "tenant/ns"
    assert t.managed_ledger_name == "tenant/ns/persistent/topic"
    assert t.full == "persistent://tenant/ns/topic"
    assert str(t) == t.full
    assert TopicName.parse(t) is t
    assert TopicName.parse(t.full) == t == TopicName.parse(t.managed_ledger_name)
    assert t.namespace_obj == NamespaceName("tenant", "ns")


@pytest.mark.parametrize(
    "text, local",
    [
        ("public/default/my-topic-partition-0", "my-topic-partition-0"),
        ("a_b/c.d/e=f", "e=f"),
        ("t/ns/UPPER.lower_09-x", "UPPER.lower_09-x"),
        ("t/ns/a:b", "a:b"),
        ("t/ns/100%", "100%"),
        ("t/ns/...", "..."),
        ("t/ns/.hidden", ".hidden"),
        ("t/ns/" + "x" * 255, "x" * 255),
        ("persistent://t/ns/persistent", "persistent"),
    ],
)
def test_accepted(text, local):
    t = TopicName.parse(text)
    assert t.local_name == local
    assert TopicName.parse(t.full) == t
    assert TopicName.parse(t.managed_ledger_name) == t


def test_managed_ledger_name_is_url_encoded_like_pulsar():
    t = TopicName.parse("persistent://t/ns=1/a:b=c%d")
    assert t.managed_ledger_name == "t/ns=1/persistent/a%3Ab%3Dc%25d"
    assert TopicName.parse("t/ns=1/persistent/a%3Ab%3Dc%25d") == t
    assert TopicName.parse("t/ns/persistent/a%3ab").local_name == "a:b"  # lower-case hex too
    assert encode_local_name("plain-name_1.x") == "plain-name_1.x"
    assert encode_local_name("a b*é") == "a+b*%C3%A9"
    assert decode_local_name("a+b*%C3%A9", "x") == "a b*é"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty topic name"),
        ("t/ns", "found 2 components"),
        ("topic", "found 1 components"),
        ("t/ns/a/b/c", "found 5 components"),
        ("t/ns/cluster/topic", "tenant/namespace/persistent/topic"),
        ("persistent://t/ns/a/b", "found 4 components"),
        ("persistent://t/cluster/ns/topic", "found 4 components"),
        ("/t/ns/topic", "starts with '/'"),
        ("t/ns/topic/", "ends with '/'"),
        ("t//topic", "empty component"),
        ("t/ns//topic", "empty component"),
        ("persistent:///t/ns/topic", "starts with '/'"),
        ("persistent://t/ns/topic/", "ends with '/'"),
        ("t/../topic", "'..' is path-like"),
        ("t/ns/..", "'..' is path-like"),
        ("t/ns/.", "'.' is path-like"),
        ("../ns/topic", "'..' is path-like"),
        ("t/ns/a\\b", "backslash"),
        ("t\\ns\\topic", "backslash"),
        ("t/ns/a\x00b", "NUL"),
        ("t/ns/a\nb", "control character U+000A"),
        ("t/ns/a\x7fb", "control character U+007F"),
        ("t/ns/a b", "contains ' '"),
        ("t/ns/a+b", "contains '+'"),
        ("t/ns/a*b", "contains '*'"),
        ("t/ns/é", "contains 'é'"),
        ("t/ns/a?b", "contains '?'"),
        ("t/ns/a#b", "contains '#'"),
        ("t/ns/" + "x" * 256, "256 characters long"),
        ("t" * 256 + "/ns/topic", "256 characters long"),
        ("non-persistent://t/ns/topic", "non-persistent"),
        ("t/ns/non-persistent/topic", "non-persistent"),
        ("http://t/ns/topic", "unknown domain 'http'"),
        # managed-ledger form decodes, then validates again
        ("t/ns/persistent/a%2Fb", "contains '/'"),
        ("t/ns/persistent/%2E%2E", "'..' is path-like"),
        ("t/ns/persistent/a%00b", "NUL"),
        ("t/ns/persistent/a%2", "malformed percent-encoding"),
        ("t/ns/persistent/a%zz", "malformed percent-encoding"),
        ("t/ns/persistent/%FF", "not UTF-8"),
    ],
)
def test_rejected(text, message):
    with pytest.raises(ValidationError, match=None) as ei:
        TopicName.parse(text)
    assert message in str(ei.value), str(ei.value)


def test_rejects_non_strings_and_bad_direct_construction():
    with pytest.raises(ValidationError):
        TopicName.parse(None)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        TopicName.parse(b"t/ns/x")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="path-like"):
        TopicName("t", "ns", "..")
    with pytest.raises(ValidationError, match="contains '/'"):
        TopicName("t", "ns", "a/b")


@pytest.mark.parametrize("text", ["tenant/ns", "a-b/c_d.e", "t:1/n=2", "t/100%"])
def test_namespace_accepted(text):
    ns = NamespaceName.parse(text)
    assert ns.name == text == str(ns)
    assert NamespaceName.parse(ns) is ns
    assert ns.topic("x").full == f"persistent://{text}/x"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty namespace name"),
        ("tenant", "found 1 components"),
        ("t/ns/x", "found 3 components"),
        ("/t/ns", "starts with '/'"),
        ("t/ns/", "ends with '/'"),
        ("t//ns", "empty component"),
        ("t/..", "path-like"),
        ("./ns", "path-like"),
        ("t/n s", "contains ' '"),
        ("t\\ns", "backslash"),
        ("t/n\x00", "NUL"),
        ("t/" + "n" * 256, "256 characters long"),
        ("persistent://t/ns", "not a topic URL"),
    ],
)
def test_namespace_rejected(text, message):
    with pytest.raises(ValidationError) as ei:
        NamespaceName.parse(text)
    assert message in str(ei.value), str(ei.value)
