"""Cloudflare's official Python SDK (cloudflare==4.3.1) against a walrelay
fleet node's control plane: create, list (paginated), get, query and raw
by uuid, delete, and errors raised as the SDK raises Cloudflare's.

Usage: sdk_fleet.py BASE_URL BEARER_TOKEN
Prints "ok" and exits 0, or prints what failed and exits 1.
"""

import sys

import cloudflare
from cloudflare import Cloudflare

BASE, TOKEN = sys.argv[1:3]
ACCOUNT = "0123456789abcdef0123456789abcdef"


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


client = Cloudflare(api_token=TOKEN, base_url=f"{BASE}/client/v4", max_retries=0)
d1 = client.d1.database

created = d1.create(account_id=ACCOUNT, name="sdk-fleet", primary_location_hint="weur")
check(created.name == "sdk-fleet", f"created: {created}")
check(created.uuid and len(created.uuid) == 36, f"uuid: {created.uuid}")
check(created.created_at is not None, "created_at parses as a datetime")

for i in range(3):
    d1.create(account_id=ACCOUNT, name=f"sdk-more-{i}")

# list: the SDK pages through (per_page 2: two full pages and one of 0)
names = sorted(db.name for db in d1.list(account_id=ACCOUNT, per_page=2))
check(names == ["sdk-fleet", "sdk-more-0", "sdk-more-1", "sdk-more-2"], f"listed: {names}")
first = d1.list(account_id=ACCOUNT, page=1, per_page=2)
check(first.result_info.total_count == 4, f"result_info: {first.result_info}")
filtered = [db.name for db in d1.list(account_id=ACCOUNT, name="sdk-more")]
check(len(filtered) == 3, f"filtered: {filtered}")

got = d1.get(created.uuid, account_id=ACCOUNT)
check(got.uuid == created.uuid and got.name == "sdk-fleet", f"got: {got}")

# the new database takes queries at once, by uuid
res = list(
    d1.query(
        created.uuid,
        account_id=ACCOUNT,
        sql="CREATE TABLE t(x); INSERT INTO t VALUES (41), (1); SELECT sum(x) AS s FROM t",
    )
)
check(res[2].results == [{"s": 42}], f"query: {res}")
raw = list(d1.raw(created.uuid, account_id=ACCOUNT, sql="SELECT x, x FROM t ORDER BY x"))
check(raw[0].results.columns == ["x", "x"], f"raw: {raw}")

# errors are the SDK's exceptions
try:
    d1.create(account_id=ACCOUNT, name="sdk-fleet")
    check(False, "a taken name must fail")
except cloudflare.APIStatusError as e:
    check(e.status_code == 409, f"taken name: {e.status_code}")
try:
    d1.create(account_id=ACCOUNT, name="Not Valid")
    check(False, "a bad name must fail")
except cloudflare.BadRequestError:
    pass

d1.delete(created.uuid, account_id=ACCOUNT)
try:
    d1.get(created.uuid, account_id=ACCOUNT)
    check(False, "a deleted database must be gone")
except cloudflare.NotFoundError:
    pass
try:
    d1.query(created.uuid, account_id=ACCOUNT, sql="SELECT 1")
    check(False, "a deleted database must refuse queries")
except cloudflare.NotFoundError:
    pass

print("ok")
