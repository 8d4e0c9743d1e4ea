"""The Temporal UI's defaults for Daedalus, set by the read-only proxy in every page it serves (readonly_ui.py).

Temporal UI 2.54 keeps the workflow list's columns and its saved views in the browser's local storage
(`namespace-workflow-table-columns`, `saved-workflow-queries`) and has no server setting for either; its list has
no column for a workflow's static summary. So each page gets a small inline script, run before the UI starts, that

* gives a namespace the browser has no columns for: Status, Workflow ID, DaedalusTitle, DaedalusStatus,
  DaedalusWaitingFor, DaedalusOutcome, DaedalusHost, Start, End (a person's own choice is never overwritten);
* puts Daedalus's saved views in the views bar (ids `daedalus-*`), made afresh on every page: "failed in the last
  7 days" computes its date when the page opens, since a visibility query takes only absolute times;
* opens a workflow picked from the list on its "User Metadata" tab (its current details: the ticket's title, its
  status or outcome and why, who it waits for; then its static details: gates and rules) instead of the input
  JSON of the timeline: a plain click on a list row's link loads `.../user-metadata` (a page load: the UI's
  own router takes its links from its components, not from the page). The other tabs are one click
  away, as before.

The page's Content-Security-Policy allows scripts by hash ('strict-dynamic' plus one sha256); the script's hash is
added to it, so nothing else is allowed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

COLUMNS = [
    "Status",
    "Workflow ID",
    "DaedalusTitle",
    "DaedalusStatus",
    "DaedalusWaitingFor",
    "DaedalusOutcome",
    "DaedalusHost",
    "Start",
    "End",
]
WEEK_MS = 7 * 24 * 3600 * 1000
VIEWS = [
    ("daedalus-waiting", "Waiting for a decision",
     'DaedalusStatus IN ("awaiting_approval", "awaiting_decision") AND ExecutionStatus = "Running"'),
    ("daedalus-live", "Tickets, live", 'WorkflowType = "TicketWorkflow" AND ExecutionStatus = "Running"'),
    ("daedalus-failed-week", "Failed in the last 7 days",
     'DaedalusOutcome IN ("failed", "stopped by the rules") AND CloseTime > "{week_ago}"'),
    ("daedalus-exception", "Closed under exception", 'DaedalusOutcome = "closed under exception"'),
    ("daedalus-gating", "Being measured", 'DaedalusStatus = "gating" AND ExecutionStatus = "Running"'),
]  # fmt: skip
"""(id, name, query); `{week_ago}` becomes the ISO time seven days before the page opened."""

SCRIPT = (
    "(function(){try{"
    "var S=window.localStorage;"
    f"var columns={json.dumps([{'label': c} for c in COLUMNS])};"
    f"var views={json.dumps([{'id': i, 'name': n, 'query': q} for i, n, q in VIEWS])};"
    "var m=/\\/namespaces\\/([^/]+)/.exec(window.location.pathname);"
    "var spaces=['default'];if(m&&spaces.indexOf(decodeURIComponent(m[1]))<0){spaces.push(decodeURIComponent(m[1]));}"
    f"var weekAgo=new Date(Date.now()-{WEEK_MS}).toISOString();"
    "var cols=JSON.parse(S.getItem('namespace-workflow-table-columns')||'{}')||{};"
    "var saved=JSON.parse(S.getItem('saved-workflow-queries')||'{}')||{};"
    "spaces.forEach(function(ns){"
    "if(!cols[ns]||!cols[ns].length){cols[ns]=columns;}"
    "var own=(saved[ns]||[]).filter(function(v){return String(v.id).indexOf('daedalus-')!==0;});"
    "saved[ns]=views.map(function(v){return {id:v.id,name:v.name,query:v.query.replace('{week_ago}',weekAgo)};})"
    ".concat(own);});"
    "S.setItem('namespace-workflow-table-columns',JSON.stringify(cols));"
    "S.setItem('saved-workflow-queries',JSON.stringify(saved));"
    "}catch(e){}"
    "var list=/^\\/namespaces\\/[^/]+\\/workflows\\/?$/;"
    "var run=/^(\\/namespaces\\/[^/]+\\/workflows\\/[^/]+\\/[^/]+)(\\/history|\\/timeline)?\\/?$/;"
    "window.addEventListener('click',function(e){"
    "var a=e.target&&e.target.closest?e.target.closest('a[href]'):null;"
    "if(!a||!list.test(window.location.pathname)){return;}"
    "var u=new URL(a.href,window.location.href);var m=run.exec(u.pathname);"
    "if(u.origin===window.location.origin&&m&&!e.ctrlKey&&!e.metaKey&&!e.shiftKey&&e.button===0){"
    "e.preventDefault();e.stopImmediatePropagation();window.location.assign(m[1]+'/user-metadata'+u.search);}"
    "},true);"
    "})();"
)
SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP_META = re.compile(
    rb'(<meta http-equiv="content-security-policy" content="script-src [^"]*)(")', re.IGNORECASE
)


def with_defaults(page: bytes) -> bytes:
    """The UI's page with the defaults' script at the top of <head>, allowed by hash in its CSP. A page without
    the CSP meta the UI writes (another UI version) is served as it is: no script runs that the page did not
    allow."""
    allowed, found = CSP_META.subn(
        lambda m: m.group(1) + f" '{SCRIPT_HASH}'".encode() + m.group(2), page, count=1
    )
    if not found or b"<head>" not in allowed:
        return page
    return allowed.replace(b"<head>", b"<head><script>" + SCRIPT.encode() + b"</script>", 1)
