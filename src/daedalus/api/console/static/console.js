// Live updates: poll the console's version (the newest audit event) and reload when something was recorded,
// unless the decider is typing; then say so instead of throwing their words away.
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="daedalus-version"]');
  if (!meta) { return; }
  var shown = meta.getAttribute("content");
  var banner = document.getElementById("live");
  function busy() {
    var active = document.activeElement;
    if (active && (active.tagName === "TEXTAREA" || active.tagName === "INPUT" || active.tagName === "SELECT")) {
      return true;
    }
    var fields = document.querySelectorAll("textarea, input:not([type=hidden]):not([type=checkbox])");
    for (var i = 0; i < fields.length; i++) { if (fields[i].value) { return true; } }
    var boxes = document.querySelectorAll("input[type=checkbox]");
    for (var j = 0; j < boxes.length; j++) { if (boxes[j].checked) { return true; } }
    return false;
  }
  function poll() {
    fetch("/console/changes", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) {
        if (!body || body.version === shown) { return; }
        if (busy()) { if (banner) { banner.hidden = false; } return; }
        window.location.reload();
      })
      .catch(function () { /* the API restarting: try again on the next tick */ });
  }
  window.setInterval(poll, 2000);
})();
