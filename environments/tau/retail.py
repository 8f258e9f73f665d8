"""τ²-bench's retail domain: users, products with variants, orders; 15 tools.

Written from the benchmark's tool semantics (src/tau2/domains/retail/tools.py and its data
model), not copied, with its checks in its order and its error messages, and its quirks: a
multi-item `modify_pending_order_items` gives every modified item the price and options of the
last new variant in the list, and its price difference is not rounded (an exchange's is).
tests/tau/test_tau_upstream_diff.py checks this against the published package on every task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from environments.tau.domain import CALCULATE, TRANSFER_TO_HUMAN_AGENTS, Domain, DomainTool

__all__ = ["DOMAIN"]

Db = dict[str, Any]

_ORDER_OPTIONAL = (
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "exchange_price_difference",
    "return_items",
    "return_payment_method_id",
)
CANCEL_REASONS = ("no longer needed", "ordered by mistake")


def _normalise(db: Db) -> None:
    for order in db.get("orders", {}).values():
        for key in _ORDER_OPTIONAL:
            order.setdefault(key, None)


def _order(db: Db, order_id: str) -> dict[str, Any]:
    if order_id not in db["orders"]:
        raise ValueError("Order not found")
    return db["orders"][order_id]


def _user(db: Db, user_id: str) -> dict[str, Any]:
    if user_id not in db["users"]:
        raise ValueError("User not found")
    return db["users"][user_id]


def _product(db: Db, product_id: str) -> dict[str, Any]:
    if product_id not in db["products"]:
        raise ValueError("Product not found")
    return db["products"][product_id]


def _variant(db: Db, product_id: str, item_id: str) -> dict[str, Any]:
    variants = _product(db, product_id)["variants"]
    if item_id not in variants:
        raise ValueError("Variant not found")
    return variants[item_id]


def _payment_method(db: Db, user_id: str, method_id: str) -> dict[str, Any]:
    methods = _user(db, user_id)["payment_methods"]
    if method_id not in methods:
        raise ValueError("Payment method not found")
    return methods[method_id]


def _is_gift_card(method: dict[str, Any]) -> bool:
    return method.get("source") == "gift_card"


def _check_counts(order: dict[str, Any], item_ids: list[str], message: str) -> None:
    held = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > held.count(item_id):
            raise ValueError(message.format(item_id=item_id))


@dataclass(frozen=True)
class _Swap:
    """How one of the two tools that swap items for other variants words its refusals and prices the swap: as
    published they differ (`distinct`: a new item must differ from the one it replaces; `rounded`: the price
    difference is rounded to cents before anything else sees it)."""

    missing: str  # an item id asked for more often than the order holds it
    mismatch: str  # item_ids and new_item_ids differ in length
    short_balance: str  # a gift card whose balance does not cover the difference
    distinct: bool
    rounded: bool


_EXCHANGE = _Swap(
    "Number of {item_id} not found.",
    "The number of items to be exchanged should match.",
    "Insufficient gift card balance to pay for the price difference",
    distinct=False,
    rounded=True,
)
_MODIFY = _Swap(
    "{item_id} not found",
    "The number of items to be exchanged should match",
    "Insufficient gift card balance to pay for the new item",
    distinct=True,
    rounded=False,
)


def _priced_swap(
    db: Db, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str], payment_method_id: str, swap: _Swap
) -> tuple[float, dict[str, Any]]:
    """Checks swapping each of `item_ids` for its new variant in the benchmark's order; the summed price change
    and the payment method that settles it."""
    _check_counts(order, item_ids, swap.missing)
    if len(item_ids) != len(new_item_ids):
        raise ValueError(swap.mismatch)
    diff = 0.0
    for item_id, new_id in zip(item_ids, new_item_ids):
        if swap.distinct and item_id == new_id:
            raise ValueError("The new item id should be different from the old item id")
        old = next(item for item in order["items"] if item["item_id"] == item_id)
        variant = _variant(db, old["product_id"], new_id)
        if not variant["available"]:
            raise ValueError(f"New item {new_id} not found or available")
        diff += variant["price"] - old["price"]
    if swap.rounded:
        diff = round(diff, 2)
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff:
        raise ValueError(swap.short_balance)
    return diff, method


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> dict[str, str]:
    return {"address1": address1, "address2": address2, "city": city, "country": country, "state": state, "zip": zip}


# ---- tools --------------------------------------------------------------------------------------


def cancel_pending_order(db: Db, order_id: str, reason: str) -> dict[str, Any]:
    """Cancel a pending order; reason is 'no longer needed' or 'ordered by mistake'. Gift card payments are refunded at
    once, others in 5-7 business days. Needs the user's explicit confirmation first."""
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be cancelled")
    if reason not in CANCEL_REASONS:
        raise ValueError("Invalid reason")
    methods = [_payment_method(db, order["user_id"], p["payment_method_id"]) for p in order["payment_history"]]
    refunds = []
    for payment, method in zip(order["payment_history"], methods):
        refunds.append(
            {
                "transaction_type": "refund",
                "amount": payment["amount"],
                "payment_method_id": payment["payment_method_id"],
            }
        )
        if _is_gift_card(method):  # gift cards are refunded at once, other methods in 5-7 days
            method["balance"] = round(method["balance"] + payment["amount"], 2)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return order


def exchange_delivered_order_items(
    db: Db, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    """Exchange items of a delivered order for other available variants of the same products (once per order); the
    payment method pays or receives the price difference."""
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be exchanged")
    diff, _ = _priced_swap(db, order, item_ids, new_item_ids, payment_method_id, _EXCHANGE)
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    return order


def find_user_id_by_name_zip(db: Db, first_name: str, last_name: str, zip: str) -> str:
    """Find a user id by first name, last name and zip code."""
    for user_id, user in db["users"].items():
        name = user["name"]
        if (
            name["first_name"].lower() == first_name.lower()
            and name["last_name"].lower() == last_name.lower()
            and user["address"]["zip"] == zip
        ):
            return str(user_id)
    raise ValueError("User not found")


def find_user_id_by_email(db: Db, email: str) -> str:
    """Find a user id by email address."""
    for user_id, user in db["users"].items():
        if user["email"].lower() == email.lower():
            return str(user_id)
    raise ValueError("User not found")


def get_order_details(db: Db, order_id: str) -> dict[str, Any]:
    """Status, items, address and payments of an order."""
    return _order(db, order_id)


def get_product_details(db: Db, product_id: str) -> dict[str, Any]:
    """A product and all its variants (item ids, options, availability, price)."""
    return _product(db, product_id)


def get_user_details(db: Db, user_id: str) -> dict[str, Any]:
    """A user's profile: name, address, email, payment methods, orders."""
    return _user(db, user_id)


def list_all_product_types(db: Db) -> str:
    """Names and product ids of every product type in the store."""
    return json.dumps({p["name"]: p["product_id"] for p in db["products"].values()}, sort_keys=True)


def modify_pending_order_address(
    db: Db, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> dict[str, Any]:
    """Change the shipping address of a pending order."""
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ValueError("Non-pending order cannot be modified")
    order["address"] = _address(address1, address2, city, state, country, zip)
    return order


def modify_pending_order_items(
    db: Db, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    """Change items of a pending order to other available variants of the same products (once per order); the payment
    method pays or receives the difference."""
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be modified")
    diff, method = _priced_swap(db, order, item_ids, new_item_ids, payment_method_id, _MODIFY)
    order["payment_history"].append(
        {
            "transaction_type": "payment" if diff > 0 else "refund",
            "amount": abs(diff),
            "payment_method_id": payment_method_id,
        }
    )
    if _is_gift_card(method):
        method["balance"] = round(method["balance"] - diff, 2)
    # As the published tool does: every modified item takes the price and options of the LAST new
    # variant in the list (its loop reuses that variable), whatever its own new id.
    last = _variant(db, next(i for i in order["items"] if i["item_id"] == item_ids[-1])["product_id"], new_item_ids[-1])
    for item_id, new_id in zip(item_ids, new_item_ids):
        item = next(i for i in order["items"] if i["item_id"] == item_id)  # a repeated id: the next one each time
        item.update(item_id=new_id, price=last["price"], options=dict(last["options"]))
    order["status"] = "pending (item modified)"
    return order


def modify_pending_order_payment(db: Db, order_id: str, payment_method_id: str) -> dict[str, Any]:
    """Pay a pending order with another of the user's payment methods."""
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ValueError("Non-pending order cannot be modified")
    method = _payment_method(db, order["user_id"], payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ValueError("There should be exactly one payment for a pending order")
    old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
    if old_id == payment_method_id:
        raise ValueError("The new payment method should be different from the current one")
    if _is_gift_card(method) and method["balance"] < amount:
        raise ValueError("Insufficient gift card balance to pay for the order")
    old_method = _payment_method(db, order["user_id"], old_id)
    history.append({"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id})
    history.append({"transaction_type": "refund", "amount": amount, "payment_method_id": old_id})
    if _is_gift_card(method):
        method["balance"] = round(method["balance"] - amount, 2)
    if _is_gift_card(old_method):
        old_method["balance"] = round(old_method["balance"] + amount, 2)
    return order


def modify_user_address(
    db: Db, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> dict[str, Any]:
    """Change a user's default address."""
    user = _user(db, user_id)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


def return_delivered_order_items(db: Db, order_id: str, item_ids: list[str], payment_method_id: str) -> dict[str, Any]:
    """Request the return of items of a delivered order; the refund goes to the original payment method or a gift
    card."""
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be returned")
    method = _payment_method(db, order["user_id"], payment_method_id)
    if not _is_gift_card(method) and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        raise ValueError("Payment method should be the original payment method")
    _check_counts(order, item_ids, "Some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


# ---- schemas ----------------------------------------------------------------------------------

_S = {"type": "string"}
_IDS = {"type": "array", "items": {"type": "string"}}
_ORDER_ID = {"type": "string", "description": "The order id, with its leading '#', e.g. '#W0000000'"}
_PAYMENT = {"type": "string", "description": "A payment method id of the user, e.g. 'gift_card_0000000'"}
_ADDRESS = {k: _S for k in ("address1", "address2", "city", "state", "country", "zip")}
_REASON = {"type": "string", "description": "'no longer needed' or 'ordered by mistake'"}
_SWAP = {"order_id": _ORDER_ID, "item_ids": _IDS, "new_item_ids": _IDS, "payment_method_id": _PAYMENT}


_TOOLS = [
    CALCULATE,
    DomainTool.of(cancel_pending_order, "write", {"order_id": _ORDER_ID, "reason": _REASON}),
    DomainTool.confirmed(exchange_delivered_order_items, _SWAP),
    DomainTool.of(find_user_id_by_name_zip, "read", {"first_name": _S, "last_name": _S, "zip": _S}),
    DomainTool.of(find_user_id_by_email, "read", {"email": _S}),
    DomainTool.of(get_order_details, "read", {"order_id": _ORDER_ID}),
    DomainTool.of(get_product_details, "read", {"product_id": _S}),
    DomainTool.of(get_user_details, "read", {"user_id": _S}),
    DomainTool.of(list_all_product_types, "read", {}),
    DomainTool.confirmed(modify_pending_order_address, {"order_id": _ORDER_ID, **_ADDRESS}),
    DomainTool.confirmed(modify_pending_order_items, _SWAP),
    DomainTool.confirmed(modify_pending_order_payment, {"order_id": _ORDER_ID, "payment_method_id": _PAYMENT}),
    DomainTool.confirmed(modify_user_address, {"user_id": _S, **_ADDRESS}),
    DomainTool.confirmed(
        return_delivered_order_items, {"order_id": _ORDER_ID, "item_ids": _IDS, "payment_method_id": _PAYMENT}
    ),
    TRANSFER_TO_HUMAN_AGENTS,
]

DOMAIN = Domain("retail", "RetailTools", {t.name: t for t in _TOOLS}, normalise=_normalise)
