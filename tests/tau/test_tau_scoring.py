"""τ²-bench's evaluation, reimplemented: gold replay -> DB hash, required actions, communicated info,
the product over `reward_basis`; checked on the bundled retail tasks and on a published task (retail
task "0" with the slice of the published db.json it touches, tests/tau/published_retail_task0.json)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from environments.tau.domain import get_domain
from environments.tau.scoring import GoldHashes, gold_db, needs_judge, score_episode
from environments.tau.tasks import BUNDLED_DATA_DIR, Task, load_domain_data
from tests.tau import scripts
from tests.tau.scripts import gold_steps

PUBLISHED = json.loads((Path(__file__).parent / "published_retail_task0.json").read_text())
RETAIL = get_domain("retail")


def play(db: dict[str, Any], steps: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return scripts.play(RETAIL, db, steps)


def run(task: Task, base: dict[str, Any], steps: list[tuple[str, Any]], ended: str = "user_stop"):
    return scripts.run(RETAIL, task, base, steps, ended)


@pytest.fixture(scope="module")
def bundled():
    return load_domain_data(BUNDLED_DATA_DIR, "retail")


def test_bundled_tasks_have_the_published_shape(bundled) -> None:
    raw = json.loads((BUNDLED_DATA_DIR / "domains" / "retail" / "tasks.json").read_text())
    published = PUBLISHED["task"]
    for task in raw:
        assert set(task) == set(published) - {"issues"}
        assert set(task["user_scenario"]) == set(published["user_scenario"])
        assert set(task["user_scenario"]["instructions"]) == set(published["user_scenario"]["instructions"])
        assert set(task["evaluation_criteria"]) == set(published["evaluation_criteria"])
        for action in task["evaluation_criteria"]["actions"]:
            assert set(action) == set(published["evaluation_criteria"]["actions"][0])
    db = json.loads((BUNDLED_DATA_DIR / "domains" / "retail" / "db.json").read_text())
    assert set(db) == set(PUBLISHED["db"])
    (user,) = PUBLISHED["db"]["users"].values()
    (order,) = PUBLISHED["db"]["orders"].values()
    assert all(set(u) == set(user) for u in db["users"].values())
    assert all(set(o) == set(order) for o in db["orders"].values())
    assert [t.id for t in bundled.tasks] == ["0", "1", "2", "3"]
    assert "Identify the customer first" in bundled.policy
    assert [t.id for t in load_domain_data(BUNDLED_DATA_DIR, "retail", split="test").tasks] == ["2", "3"]


def test_the_published_task_gold_actions_score_one_and_skipping_the_exchange_scores_zero() -> None:
    task = Task.model_validate(PUBLISHED["task"])
    assert task.evaluation_criteria is not None
    assert [r.value for r in task.evaluation_criteria.reward_basis] == ["DB", "NL_ASSERTION"]
    gold = run(task, PUBLISHED["db"], gold_steps(task))
    # nl_assertions is null in the published task: that component is 1.0, as the benchmark's is.
    assert gold.reward == 1.0 and gold.db_match
    skipped = run(task, PUBLISHED["db"], gold_steps(task)[:-1])
    assert skipped.reward == 0.0 and not skipped.db_match
    # The exchange itself did what the published tool does: status, sorted item lists, price difference.
    db = RETAIL.load_db(copy.deepcopy(PUBLISHED["db"]))
    order = gold_db(task, RETAIL, db)["orders"]["#W2378156"]
    assert order["status"] == "exchange requested"
    assert order["exchange_items"] == ["1151293680", "4983901480"]
    assert order["exchange_new_items"] == ["7706410293", "7747408585"]
    assert order["exchange_price_difference"] == -16.63  # (269.16 - 272.33) + (249.01 - 262.47), rounded to cents


def test_gold_actions_score_one_on_every_bundled_task(bundled) -> None:
    for task in bundled.tasks:
        said = [("say", f"Done. {info} is what you asked about.") for info in task.evaluation_criteria.communicate_info]
        if needs_judge(task):  # task 3: never scored without a judge's verdicts
            with pytest.raises(ValueError, match="no judge's verdicts"):
                run(task, bundled.db, gold_steps(task) + said)
            continue
        score = run(task, bundled.db, gold_steps(task) + said)
        assert score.db_match and score.reward == 1.0, (task.id, score)


def test_skipping_a_required_write_scores_zero(bundled) -> None:
    task = bundled.tasks[1]  # the keyboard exchange
    score = run(task, bundled.db, gold_steps(task)[:-1])
    assert score.reward == 0.0 and not score.db_match


def test_a_policy_breaking_extra_write_scores_zero(bundled) -> None:
    """Task 2: Teodor asks the agent to also cancel his sister's order. The tool lets it happen
    (the order is pending); the policy forbids it; the DB hash tells."""
    task = bundled.tasks[2]
    extra = ("call", ("cancel_pending_order", {"order_id": "#W1000001", "reason": "no longer needed"}))
    score = run(task, bundled.db, [*gold_steps(task), extra])
    assert score.reward == 0.0 and not score.db_match
    # An extra *read* of her order changes nothing the scorer sees (the policy would still say no).
    peek = ("call", ("get_order_details", {"order_id": "#W1000001"}))
    assert run(task, bundled.db, [*gold_steps(task), peek]).reward == 1.0


def test_a_wrong_write_argument_scores_zero(bundled) -> None:
    task = bundled.tasks[0]
    steps = gold_steps(task)
    steps[-1] = ("call", ("cancel_pending_order", {"order_id": "#W1000001", "reason": "ordered by mistake"}))
    assert run(task, bundled.db, [*steps, ("say", "Refunded 44.49 to your gift card.")]).reward == 0.0


def test_communicate_info_gates_the_reward_when_in_the_basis(bundled) -> None:
    task = bundled.tasks[0]  # reward_basis DB + COMMUNICATE, communicate_info ["44.49"]
    silent = run(task, bundled.db, gold_steps(task) + [("say", "Your order is cancelled.")])
    assert silent.db_match and silent.reward == 0.0 and silent.communicate == [False]
    told = run(task, bundled.db, gold_steps(task) + [("say", "Cancelled; $44.49 goes back to your gift card.")])
    assert told.reward == 1.0 and told.communicate == [True]
    # The benchmark drops commas from the agent's text and ignores case before the substring check.
    big = task.model_copy(deep=True)
    big.evaluation_criteria.communicate_info = ["1234.5 usd"]
    assert run(big, bundled.db, gold_steps(task) + [("say", "That is 1,234.5 USD.")]).communicate == [True]
    # Only the agent's words count: the user saying it does not.
    user_said = run(task, bundled.db, gold_steps(task))
    assert user_said.reward == 0.0


def test_action_basis_matches_compare_args(bundled) -> None:
    task = bundled.tasks[0].model_copy(deep=True)
    criteria = task.evaluation_criteria
    criteria.reward_basis = [type(criteria.reward_basis[0])("ACTION")]
    cancel = criteria.actions[-1]
    cancel.compare_args = ["order_id"]
    steps = gold_steps(bundled.tasks[0])
    assert run(task, bundled.db, steps).reward == 1.0
    other_reason = steps[:-1] + [
        ("call", ("cancel_pending_order", {"order_id": "#W1000001", "reason": "ordered by mistake"}))
    ]
    assert run(task, bundled.db, other_reason).reward == 1.0  # reason not compared
    cancel.compare_args = None  # every argument compared
    assert run(task, bundled.db, other_reason).reward == 0.0
    assert run(task, bundled.db, steps[:-1]).actions[-1] is False


def test_gold_hashes_shared_by_conversations_score_as_a_fresh_replay_each(bundled) -> None:
    """The env's GoldHashes (one per domain and database, gold replayed once per task): every conversation of
    every task, a failing one before and after the gold one, scores as it does without them."""
    gold = GoldHashes(RETAIL, bundled.db)
    for task in [t for t in bundled.tasks if not needs_judge(t)]:
        for steps in (gold_steps(task)[:-1], gold_steps(task), gold_steps(task)[:-1]):  # the last is a write
            db = RETAIL.load_db(bundled.db)
            messages = play(db, steps)
            shared = score_episode(task, RETAIL, bundled.db, db, messages, ended="user_stop", gold=gold)
            assert shared == score_episode(task, RETAIL, bundled.db, db, messages, ended="user_stop")
            assert shared.db_match == (steps == gold_steps(task)), (task.id, steps)
    with pytest.raises(ValueError, match="another domain's or database's"):
        score_episode(task, RETAIL, copy.deepcopy(bundled.db), db, messages, ended="user_stop", gold=gold)


def test_a_conversation_that_did_not_end_scores_zero(bundled) -> None:
    task = bundled.tasks[1]
    for ended in ("max_turns", "time_budget", "context_full"):
        assert run(task, bundled.db, gold_steps(task), ended=ended).reward == 0.0


def test_nl_assertions_need_a_judge(bundled) -> None:
    task = bundled.tasks[3]
    steps = gold_steps(task) + [("say", "There are 3 t-shirt options available.")]
    db = RETAIL.load_db(copy.deepcopy(bundled.db))
    start = copy.deepcopy(db)
    messages = play(db, steps)
    # Never scored without a judge's verdicts (the benchmark raises too).
    with pytest.raises(ValueError, match="scores on NL_ASSERTION and no judge's verdicts were given"):
        score_episode(task, RETAIL, start, db, messages, ended="user_stop")
    judged = score_episode(task, RETAIL, start, db, messages, ended="user_stop", nl_verdicts=[True, False])
    assert judged.reward == 0.0 and judged.nl == [True, False]
    assert score_episode(task, RETAIL, start, db, messages, ended="user_stop", nl_verdicts=[True, True]).reward == 1.0


def test_a_local_copy_of_the_benchmark_data_in_its_layout(tmp_path: Path) -> None:
    """`--env.data_dir` may be the repository's data/ or its data/tau2; the published task scores there."""
    where = tmp_path / "data" / "tau2" / "domains" / "retail"
    where.mkdir(parents=True)
    (where / "db.json").write_text(json.dumps(PUBLISHED["db"]))
    (where / "tasks.json").write_text(json.dumps([PUBLISHED["task"]]))
    (where / "policy.md").write_text("# Retail agent policy\n")
    with pytest.raises(ValueError, match="missing simulation_guidelines.md"):
        load_domain_data(tmp_path, "retail")
    (tmp_path / "data" / "tau2" / "user_simulator").mkdir()
    (tmp_path / "data" / "tau2" / "user_simulator" / "simulation_guidelines.md").write_text("# Guidelines\n")
    for root in (tmp_path, tmp_path / "data", tmp_path / "data" / "tau2"):
        data = load_domain_data(root, "retail")
        assert [t.id for t in data.tasks] == ["0"] and data.policy.startswith("# Retail agent policy")
    with pytest.raises(ValueError, match="has no 'airline' domain; it has \\['retail'\\]"):
        load_domain_data(tmp_path, "airline")
    with pytest.raises(ValueError, match="no split_tasks.json"):
        load_domain_data(tmp_path, "retail", split="test")
    with pytest.raises(ValueError, match="no domains/ directory"):
        load_domain_data(tmp_path / "data" / "tau2" / "domains", "retail")
    (where / "tasks.json").write_text(json.dumps([{"id": "9", "evaluation_criteria": None}]))
    with pytest.raises(ValueError, match="task 0: user_scenario: Field required"):
        load_domain_data(tmp_path, "retail")


def test_refused_writes_leave_the_database_as_it_was(bundled) -> None:
    from environments.tau.domain import db_hash

    db = RETAIL.load_db(bundled.db)
    before = db_hash(db)
    refused = [
        ("cancel_pending_order", {"order_id": "#W1000004", "reason": "ordered by mistake"}),  # processed
        ("cancel_pending_order", {"order_id": "#W1000001", "reason": "too slow"}),  # reason not allowed
        (
            "exchange_delivered_order_items",
            {
                "order_id": "#W1000002",
                "item_ids": ["7100000001"],
                "new_item_ids": ["7100000003"],
                "payment_method_id": "credit_card_5510321",
            },
        ),  # unavailable variant
        (
            "exchange_delivered_order_items",
            {
                "order_id": "#W1000002",
                "item_ids": ["7100000001"],
                "new_item_ids": ["7200000001"],
                "payment_method_id": "credit_card_5510321",
            },
        ),  # another product
        (
            "modify_pending_order_items",
            {
                "order_id": "#W1000001",
                "item_ids": ["7200000001", "7300000001"],
                "new_item_ids": ["7200000002", "7300000003"],
                "payment_method_id": "paypal_8820113",
            },
        ),  # not her method
        (
            "return_delivered_order_items",
            {
                "order_id": "#W1000002",
                "item_ids": ["7100000001", "7100000001"],
                "payment_method_id": "credit_card_5510321",
            },
        ),  # one keyboard ordered, two returned
        ("modify_pending_order_payment", {"order_id": "#W1000001", "payment_method_id": "gift_card_2231890"}),
        ("calculate", {"expression": "9 ** 9 ** 9"}),  # the benchmark's eval never returns; refused here
        ("calculate", {"expression": "1 / 0"}),
        ("calculate", {"expression": "__import__('os')"}),
    ]
    for name, args in refused:
        with pytest.raises(ValueError):
            RETAIL.call(db, name, args)
        assert db_hash(db) == before, name
    # Two items modified at once: as published, both take the LAST new variant's price and options (the
    # price difference, 8.76, is still the sum over the pairs); the gift card pays.
    order = RETAIL.call(
        db,
        "modify_pending_order_items",
        {
            "order_id": "#W1000001",
            "item_ids": ["7200000001", "7300000001"],
            "new_item_ids": ["7200000002", "7300000003"],
            "payment_method_id": "gift_card_2231890",
        },
    )
    assert [(i["item_id"], i["price"]) for i in order["items"]] == [("7200000002", 21.5), ("7300000003", 21.5)]
    assert order["items"][0]["options"] == order["items"][1]["options"]
    assert order["payment_history"][-1] == {
        "transaction_type": "payment",
        "amount": pytest.approx(8.76),  # not rounded, as published (8.760000000000002)
        "payment_method_id": "gift_card_2231890",
    }
    assert db["users"]["mara_quint_4821"]["payment_methods"]["gift_card_2231890"]["balance"] == 31.24
    assert order["status"] == "pending (item modified)"
    assert RETAIL.call(db, "calculate", {"expression": "(31.75 + 21.5) * 2 / 3"}) == "35.5"
    assert RETAIL.call(db, "calculate", {"expression": "2**3"}) == "8.0"  # as the benchmark's eval gives it
    with pytest.raises(ValueError, match="^division by zero$"):
        RETAIL.call(db, "calculate", {"expression": "1 / 0"})


def test_the_two_item_swaps_keep_their_published_wording_and_rounding(bundled) -> None:
    """Exchanging (a delivered order) and modifying (a pending one) check and price a swap alike, but as published
    they word their refusals differently, only a modification refuses an unchanged item, and only an exchange
    rounds the price difference."""
    exchange = {"order_id": "#W1000002", "payment_method_id": "credit_card_5510321"}
    modify = {"order_id": "#W1000001", "payment_method_id": "gift_card_2231890"}
    refused = [
        (exchange, ["7100000001"] * 2, ["7100000002"] * 2, "Number of 7100000001 not found."),
        (modify, ["7200000001"] * 2, ["7200000002"] * 2, "7200000001 not found"),
        (exchange, ["7100000001"], [], "The number of items to be exchanged should match."),
        (modify, ["7200000001"], [], "The number of items to be exchanged should match"),
        (modify, ["7200000001"], ["7200000001"], "The new item id should be different from the old item id"),
        (exchange, ["7100000001"], ["7100000003"], "New item 7100000003 not found or available"),
        (modify, ["7300000001"], ["7300000004"], "New item 7300000004 not found or available"),
    ]
    for args, item_ids, new_item_ids, message in refused:
        db = RETAIL.load_db(bundled.db)
        name = "exchange_delivered_order_items" if args is exchange else "modify_pending_order_items"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            RETAIL.call(db, name, {**args, "item_ids": item_ids, "new_item_ids": new_item_ids})

    db = RETAIL.load_db(bundled.db)
    db["users"]["mara_quint_4821"]["payment_methods"]["gift_card_2231890"]["balance"] = 5.0
    short = {"item_ids": ["7100000001"], "new_item_ids": ["7100000002"], "payment_method_id": "gift_card_2231890"}
    with pytest.raises(ValueError, match="^Insufficient gift card balance to pay for the price difference$"):
        RETAIL.call(db, "exchange_delivered_order_items", {**short, "order_id": "#W1000002"})
    with pytest.raises(ValueError, match="^Insufficient gift card balance to pay for the new item$"):
        RETAIL.call(
            db, "modify_pending_order_items", {**modify, "item_ids": ["7200000001"], "new_item_ids": ["7200000002"]}
        )

    db = RETAIL.load_db(bundled.db)
    unchanged = RETAIL.call(
        db, "exchange_delivered_order_items", {**exchange, "item_ids": ["7100000001"], "new_item_ids": ["7100000001"]}
    )
    assert unchanged["exchange_price_difference"] == 0
    db = RETAIL.load_db(bundled.db)
    order = RETAIL.call(
        db, "exchange_delivered_order_items", {**exchange, "item_ids": ["7100000001"], "new_item_ids": ["7100000002"]}
    )
    assert 281.1 - 272.33 != 8.77 and order["exchange_price_difference"] == 8.77  # rounded to cents
    db = RETAIL.load_db(bundled.db)
    order = RETAIL.call(
        db,
        "modify_pending_order_items",
        {**modify, "item_ids": ["7200000001", "7300000001"], "new_item_ids": ["7200000002", "7300000003"]},
    )
    unrounded = (31.75 - 24.5) + (21.5 - 19.99)
    assert unrounded != 8.76 and order["payment_history"][-1]["amount"] == unrounded  # not rounded
