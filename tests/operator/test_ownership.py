"""Which objects an InferenceService may write: only those its UID controls. The names of
its children are fixed, so anything else of the same name (a `kubernetes` Service, an
unrelated `web-canary`, another service's canary) is refused and named."""

from __future__ import annotations

from inference_operator.ownership import conflict_message, conflicts, controlled_by, refusal

UID = "u-1"


def obj(name: str, *refs: dict) -> dict:
    return {"metadata": {"name": name, "ownerReferences": list(refs)}}


def ref(uid: str, name: str = "chat", controller: bool = True) -> dict:
    return {"kind": "InferenceService", "name": name, "uid": uid, "controller": controller}


def child(kind: str, name: str) -> dict:
    return {"kind": kind, "metadata": {"name": name}}


def test_an_object_is_ours_only_when_our_uid_is_its_controller():
    assert controlled_by(obj("chat", ref(UID)), UID)
    assert not controlled_by(obj("chat"), UID)
    assert not controlled_by(obj("chat", ref("u-2")), UID)
    assert not controlled_by(obj("chat", ref(UID, controller=False)), UID)  # only an owner
    assert not controlled_by({"metadata": {"name": "chat"}}, UID)


def test_absent_or_our_own_objects_may_be_written():
    assert refusal("Service", None, UID) == ""
    assert refusal("Service", obj("chat", ref(UID)), UID) == ""


def test_a_refusal_names_the_object_and_its_controller():
    assert refusal("Service", obj("kubernetes"), UID) == (
        "Service/kubernetes exists and no controller owns it"
    )
    taken = obj("a-canary", ref("u-2", name="a"))
    assert refusal("Deployment", taken, UID) == (
        "Deployment/a-canary exists and belongs to InferenceService/a"
    )


def test_conflicts_list_every_child_in_the_way_and_only_those():
    children = [child("ConfigMap", "a-canary-stable-0123456789"), child("Deployment", "a-canary"),
                child("Service", "a-canary"), child("PodDisruptionBudget", "a-canary")]  # fmt: skip
    existing = {
        ("Deployment", "a-canary"): obj("a-canary", ref("u-2", name="a")),
        ("Service", "a-canary"): obj("a-canary", ref(UID)),
        ("PodDisruptionBudget", "a-canary"): obj("a-canary"),
    }
    assert conflicts(children, existing, UID) == [
        "Deployment/a-canary exists and belongs to InferenceService/a",
        "PodDisruptionBudget/a-canary exists and no controller owns it",
    ]
    assert conflicts(children, {}, UID) == []


def test_the_message_says_what_to_do():
    message = conflict_message(["Service/kubernetes exists and no controller owns it"])
    assert message.startswith("Service/kubernetes exists")
    assert "rename the InferenceService or remove the object" in message
