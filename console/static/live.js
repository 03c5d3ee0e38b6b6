// The console's only script: every element with data-live is reloaded
// from that URL (a server-rendered fragment) every data-refresh seconds.
// Without it the pages still work; they just do not refresh themselves.
(function () {
  "use strict";
  var period = parseInt(document.body.getAttribute("data-refresh"), 10) || 5;
  function refresh(el) {
    // Do not replace what an operator is typing into or selecting.
    if (el.contains(document.activeElement) && document.activeElement !== document.body) return;
    fetch(el.getAttribute("data-live"), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== undefined) {
          el.innerHTML = html;
          el.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () {});
  }
  document.querySelectorAll("[data-live]").forEach(function (el) {
    setInterval(function () { refresh(el); }, period * 1000);
  });
})();
