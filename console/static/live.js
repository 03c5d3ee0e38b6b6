// The console's only script: every element with data-live is reloaded
// from that URL (a server-rendered fragment) every data-refresh seconds.
// Without it the pages still work; they just do not refresh themselves.
//
// A block that stops refreshing says so: after a failed refresh (no
// answer, an error status), or when its last good one is older than two
// periods, a notice above it reads "Not updating since" the time its
// fragment was rendered (its "updated" stamp), and the block is greyed
// (class is-stale); both go at the next good refresh.
(function () {
  "use strict";
  var period = parseInt(document.body.getAttribute("data-refresh"), 10) || 5;
  var staleAfter = 2 * period * 1000; // ms

  // asOf is the time the block's fragment was rendered, as it shows it.
  function asOf(el) {
    var t = el.querySelector("[data-asof]");
    return t ? t.textContent : "the page was loaded";
  }

  function watch(el) {
    var notice = document.createElement("p");
    notice.className = "stale";
    notice.setAttribute("role", "alert");
    notice.hidden = true;
    el.parentNode.insertBefore(notice, el);
    var lastOK = Date.now(), since = asOf(el), why = "", busy = false;

    function stale(reason) {
      why = reason;
      notice.textContent = "Not updating since " + since + ": " + why +
        ". What follows may be out of date; trying again every " + period + " s.";
      notice.hidden = false;
      el.classList.add("is-stale");
    }

    function fresh(html) {
      el.innerHTML = html;
      el.setAttribute("data-refreshed", String(Date.now()));
      lastOK = Date.now();
      since = asOf(el);
      why = "";
      notice.hidden = true;
      el.classList.remove("is-stale");
    }

    function refresh() {
      // Do not replace what an operator is typing into or selecting.
      if (el.contains(document.activeElement) && document.activeElement !== document.body) {
        if (Date.now() - lastOK > staleAfter) stale("paused while the focus is in the table");
        return;
      }
      if (busy) return; // the last request still waits for its answer
      busy = true;
      // A daemon that stopped without closing the connection never
      // answers: give up on the request after two periods.
      var ctl = new AbortController();
      var timer = setTimeout(function () { ctl.abort(); }, staleAfter);
      fetch(el.getAttribute("data-live"), {credentials: "same-origin", headers: {"Accept": "text/html"}, signal: ctl.signal})
        .then(function (r) {
          if (r.status === 401) { window.location.reload(); return null; }
          if (!r.ok) throw new Error("the daemon answered " + r.status + " " + r.statusText);
          return r.text();
        })
        .then(function (html) {
          if (html !== null && html !== undefined) fresh(html);
        })
        .catch(function (err) {
          if (err && err.name === "AbortError") stale("no answer within " + staleAfter / 1000 + " s");
          else if (err && /^the daemon answered/.test(err.message)) stale(err.message);
          else stale("the daemon cannot be reached");
        })
        .finally(function () {
          clearTimeout(timer);
          busy = false;
        });
    }

    setInterval(refresh, period * 1000);
    // Checked every second, not only at a refresh: a request that hangs
    // is noticed two periods after the last good answer.
    setInterval(function () {
      if (Date.now() - lastOK > staleAfter && notice.hidden) stale("no answer for " + Math.round((Date.now() - lastOK) / 1000) + " s");
    }, 1000);
  }

  document.querySelectorAll("[data-live]").forEach(watch);
})();
