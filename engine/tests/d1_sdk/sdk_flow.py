"""Cloudflare's official Python SDK (cloudflare==4.3.1) against a walrelay
node: query (several statements, parameters), raw, batch, export and the
signed URL, import (init, PUT, ingest, poll), the time-travel bookmark,
and errors raised as the SDK raises Cloudflare's.

Usage: sdk_flow.py BASE_URL BEARER_TOKEN DATABASE_ID
Prints "ok" and exits 0, or prints what failed and exits 1.
"""

import hashlib
import sys
import urllib.request
from datetime import datetime, timezone

import cloudflare
from cloudflare import Cloudflare

BASE, TOKEN, DB = sys.argv[1:4]
ACCOUNT = "0123456789abcdef0123456789abcdef"  # accepted and ignored by a node


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


client = Cloudflare(api_token=TOKEN, base_url=f"{BASE}/client/v4", max_retries=0)
d1 = client.d1.database

# query: several statements in one sql, one result each
page = d1.query(
    DB,
    account_id=ACCOUNT,
    sql="CREATE TABLE sdk(k TEXT PRIMARY KEY, v INTEGER, r REAL); "
    "INSERT INTO sdk VALUES ('a', 1, 0.5); SELECT k, v, r FROM sdk",
)
results = list(page)
check(len(results) == 3, f"three results, got {results}")
check(results[2].success is True, "success")
check(results[2].results == [{"k": "a", "v": 1, "r": 0.5}], f"rows: {results[2].results}")
check(results[1].meta.changes == 1, f"changes: {results[1].meta}")
check(results[2].meta.served_by_primary is True, f"meta: {results[2].meta}")

# parameters (strings, as the SDK types them)
page = d1.query(DB, account_id=ACCOUNT, sql="SELECT v FROM sdk WHERE k = ?", params=["a"])
check([r.results for r in page] == [[{"v": 1}]], "a parameterised query")

# raw: duplicate column names survive
raw = list(d1.raw(DB, account_id=ACCOUNT, sql="SELECT 1 AS x, 'two' AS x"))
check(raw[0].results.columns == ["x", "x"], f"raw columns: {raw[0].results}")
check(raw[0].results.rows == [[1, "two"]], f"raw rows: {raw[0].results}")

# batch: 4.3.1's query() has no batch argument; the same path and envelope
# through the SDK's generic request
batch = client.post(
    f"/accounts/{ACCOUNT}/d1/database/{DB}/query",
    body={
        "batch": [
            {"sql": "INSERT INTO sdk(k, v) VALUES (?, ?)", "params": ["b", "2"]},
            {"sql": "SELECT count(*) AS n FROM sdk"},
        ]
    },
    cast_to=object,
)
check(batch["success"] is True, f"batch: {batch}")
check(batch["result"][1]["results"] == [{"n": 2}], f"batch rows: {batch}")

# export, then the dump from the signed URL
exp = d1.export(DB, account_id=ACCOUNT, output_format="polling")
check(exp.success is True and exp.type == "export" and exp.status == "complete", f"export: {exp}")
check(bool(exp.at_bookmark), "export at_bookmark")
check(exp.result.filename.endswith(".sql"), f"filename: {exp.result}")
dump = urllib.request.urlopen(exp.result.signed_url).read().decode()
check(dump.startswith("PRAGMA defer_foreign_keys=TRUE;"), f"dump: {dump[:200]}")
check("CREATE TABLE sdk" in dump and "INSERT INTO \"sdk\"" in dump, f"dump: {dump}")

# import: init, PUT the file to upload_url, ingest, poll
sql = "CREATE TABLE imported(x);\nINSERT INTO imported VALUES (1);\nINSERT INTO imported VALUES ('two');\n"
etag = hashlib.md5(sql.encode()).hexdigest()
init = d1.import_(DB, account_id=ACCOUNT, action="init", etag=etag)
check(init.success is True and init.type == "import", f"init: {init}")
check(bool(init.upload_url) and bool(init.filename), f"init: {init}")
put = urllib.request.Request(init.upload_url, data=sql.encode(), method="PUT")
check(urllib.request.urlopen(put).status == 200, "PUT to upload_url")
ingest = d1.import_(DB, account_id=ACCOUNT, action="ingest", etag=etag, filename=init.filename)
check(ingest.success is True and bool(ingest.at_bookmark), f"ingest: {ingest}")
poll = d1.import_(DB, account_id=ACCOUNT, action="poll", current_bookmark=ingest.at_bookmark)
check(poll.status == "complete", f"poll: {poll}")
check(poll.result.num_queries == 3, f"num_queries: {poll.result}")
check(bool(poll.result.final_bookmark), f"final_bookmark: {poll.result}")
page = d1.query(DB, account_id=ACCOUNT, sql="SELECT count(*) AS n FROM imported")
check([r.results for r in page] == [[{"n": 2}]], "the imported rows")

# the time-travel bookmark of now
now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
if hasattr(d1, "time_travel"):
    bookmark = d1.time_travel.get_bookmark(DB, account_id=ACCOUNT, timestamp=now).bookmark
else:
    # 4.3.1 predates the time_travel resource: the same path through the
    # SDK's generic request.
    bookmark = client.get(
        f"/accounts/{ACCOUNT}/d1/database/{DB}/time_travel/bookmark",
        options={"params": {"timestamp": now}},
        cast_to=object,
    )["result"]["bookmark"]
check(bool(bookmark), "a time-travel bookmark")

# errors come back as the SDK's own exceptions, with Cloudflare's codes
try:
    list(d1.query(DB, account_id=ACCOUNT, sql="SELECT * FROM no_such_table"))
    check(False, "a bad query raised nothing")
except cloudflare.BadRequestError as e:
    check(e.status_code == 400, f"status {e.status_code}")
    check("no such table" in str(e.body), f"body {e.body}")
try:
    list(d1.query("no-such-database", account_id=ACCOUNT, sql="SELECT 1"))
    check(False, "an unknown database raised nothing")
except cloudflare.NotFoundError:
    pass
try:
    d1.import_(DB, account_id=ACCOUNT, action="ingest", etag="0" * 32, filename="nope.sql")
    check(False, "an ingest of nothing raised nothing")
except cloudflare.NotFoundError:
    pass
bad = Cloudflare(api_token="wrt_not_a_token", base_url=f"{BASE}/client/v4", max_retries=0)
try:
    list(bad.d1.database.query(DB, account_id=ACCOUNT, sql="SELECT 1"))
    check(False, "a bad token raised nothing")
except cloudflare.AuthenticationError:
    pass

print("ok")
