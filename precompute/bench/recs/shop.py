"""A grocery shop's orders, generated: the second domain of `precompute bench recs`.

No public repeat-purchase data set ships inside a package on the registries (the grocery,
retail and session logs the literature uses are downloads behind a licence form), so the bench
generates one whose structure is the one next-basket methods are judged on (seeded: the same
orders on every machine):

- AISLES aisles of ITEMS_PER_AISLE products, each product's appeal Zipf-distributed in its aisle;
  every product has COMPANIONS companions (mostly in its aisle): what is bought beside it.
- Each shopper likes a few aisles and keeps STAPLES staples from them, each re-bought on its own
  cycle (every 1 to 4 orders, with a chance of skipping), and each with a lifetime after which
  the shopper stops buying it: tastes drift, so recent purchases say more than old ones.
- Each order holds the staples due, plus a few products new to the shopper: a companion of
  something in the basket (co-purchase), or a popular product of a liked aisle; a new product
  becomes a staple (replacing an expired one) with ADOPT's chance.
- Orders are days apart; every line has the order's time and the order's id (the basket).

Product names are "<aisle> product <n>": text that says which aisle, nothing more.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

AISLES = 40
ITEMS_PER_AISLE = 50
COMPANIONS = 3
STAPLES = (4, 12)
ORDERS = (6, 30)
ADOPT = 0.25
AISLE_NAMES = [
    "produce", "dairy", "bakery", "frozen", "snacks", "beverages", "pantry", "meat", "seafood", "deli",
    "breakfast", "canned", "pasta", "spices", "baking", "baby", "pets", "household", "personal care", "international",
    "condiments", "soups", "cereal", "candy", "coffee", "tea", "juice", "water", "wine", "beer",
    "cheese", "yogurt", "eggs", "bread", "nuts", "dried fruit", "oils", "sauces", "rice", "beans",
]  # fmt: skip


def shop(users: int = 1000, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """(items: id, text; orders: user_id, item_id, time, order_id), one line per product per order."""
    rng = np.random.default_rng(seed)
    items = AISLES * ITEMS_PER_AISLE
    aisle_of = np.arange(items) // ITEMS_PER_AISLE
    appeal = np.tile(1 / np.arange(1, ITEMS_PER_AISLE + 1) ** 1.1, AISLES)
    same_aisle = aisle_of[:, None] * ITEMS_PER_AISLE + rng.integers(0, ITEMS_PER_AISLE, (items, COMPANIONS))
    elsewhere = rng.integers(0, items, (items, COMPANIONS))
    companions = np.where(rng.random((items, COMPANIONS)) < 0.8, same_aisle, elsewhere)
    lines: list[tuple[int, int, int, int]] = []  # user, item, day, order
    order_id = 0
    for user in range(users):
        liked = rng.choice(AISLES, size=rng.integers(2, 6), replace=False)
        pool = np.concatenate([np.arange(a * ITEMS_PER_AISLE, (a + 1) * ITEMS_PER_AISLE) for a in liked])
        weights = appeal[pool] / appeal[pool].sum()
        staples: dict[int, tuple[int, int, int]] = {}  # item -> (cycle, phase, the last order it is bought in)
        orders = int(rng.integers(*ORDERS))
        for item in rng.choice(pool, size=min(len(pool), int(rng.integers(*STAPLES))), replace=False, p=weights):
            cycle = int(rng.integers(1, 5))
            staples[int(item)] = (cycle, int(rng.integers(cycle)), int(rng.integers(orders // 2, orders * 2)))
        had: set[int] = set()
        day = int(rng.integers(0, 30))
        for number in range(orders):
            due = [item for item, (cycle, phase, until) in staples.items() if number <= until and number % cycle == phase]
            basket = set(due)
            basket = {item for item in basket if rng.random() < 0.75}
            for _ in range(int(rng.integers(2, 6))):
                if basket and rng.random() < 0.6:
                    new = int(rng.choice(companions[rng.choice(sorted(basket))]))
                else:
                    new = int(rng.choice(pool, p=weights))
                basket.add(new)
                if new not in had and new not in staples and rng.random() < ADOPT:
                    cycle = int(rng.integers(1, 5))
                    staples[new] = (cycle, (number + 1) % cycle, orders * 2)
            had |= basket
            lines += [(user, item, day, order_id) for item in sorted(basket)]
            order_id += 1
            day += int(rng.integers(3, 10))
    table = np.array(lines, np.int64)
    names = [f"{AISLE_NAMES[aisle_of[i]]} product {i % ITEMS_PER_AISLE}" for i in range(items)]
    ids = [f"p{i:05d}" for i in range(items)]
    orders_table = pa.table(
        {
            "user_id": pa.array([f"u{u:05d}" for u in table[:, 0]]),
            "item_id": pa.array(ids).take(pa.array(table[:, 1])),
            "time": pa.array(table[:, 2] * 86_400),
            "order_id": pa.array(table[:, 3]),
        }
    )
    return pa.table({"id": ids, "text": names}), orders_table
