// Threadmill console: the little behaviour htmx does not cover. No inline scripts anywhere,
// so the console's Content-Security-Policy (script-src 'self') holds.
(function () {
  "use strict";

  // Live pages: tell the server when the tab is hidden, so it stops pushing updates.
  var sockets = [];
  function sendVisibility(socket) {
    socket.send(JSON.stringify({ visible: !document.hidden }));
  }
  // <html data-socket="open"> while a live socket is open (a page's state, and what a test waits for).
  function markSockets() {
    document.documentElement.setAttribute("data-socket", sockets.length ? "open" : "closed");
  }
  document.addEventListener("htmx:wsOpen", function (event) {
    var socket = event.detail.socketWrapper;
    sockets.push(socket);
    markSockets();
    if (document.hidden) sendVisibility(socket);
  });
  document.addEventListener("htmx:wsClose", function (event) {
    sockets = sockets.filter(function (s) { return s !== event.detail.socketWrapper; });
    markSockets();
  });
  document.addEventListener("visibilitychange", function () {
    sockets.forEach(sendVisibility);
  });

  // A poll marked data-poll="fallback" stands in for the websocket: it is skipped while one is open.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var source = event.detail.elt;
    if (sockets.length && source && source.getAttribute && source.getAttribute("data-poll") === "fallback") {
      event.preventDefault();
    }
  });

  // A table wider than the screen scrolls in its own box: make that box reachable by keyboard.
  function markScrollingTables() {
    document.querySelectorAll("main table").forEach(function (table) {
      if (table.scrollWidth > table.clientWidth + 1) {
        table.setAttribute("tabindex", "0");
      } else {
        table.removeAttribute("tabindex");
      }
    });
  }
  document.addEventListener("DOMContentLoaded", markScrollingTables);
  document.addEventListener("htmx:afterSettle", markScrollingTables);
  window.addEventListener("resize", markScrollingTables);

  // Relative times ("3 min ago") stay true on a page that is not reloaded. They count as the
  // server does (templatetags/inspector.py `relative`), on the server's clock as the page saw it.
  var serverNow = Number(document.body.getAttribute("data-server-now")) * 1000;
  var skewMs = serverNow ? serverNow - Date.now() : 0;
  function relative(deltaS) {
    var span = Math.abs(deltaS), amount;
    if (span < 1) return "now";
    if (span >= 86400) amount = Math.floor(span / 86400) + " d";
    else if (span >= 3600) amount = Math.floor(span / 3600) + " h";
    else if (span >= 60) amount = Math.floor(span / 60) + " min";
    else amount = Math.round(span) + " s";
    return deltaS > 0 ? "in " + amount : amount + " ago";
  }
  function refreshTimes() {
    var now = Date.now() + skewMs;
    document.querySelectorAll("time[datetime][title]").forEach(function (element) {
      var at = Date.parse(element.getAttribute("datetime"));
      if (!isNaN(at)) element.textContent = relative((at - now) / 1000);
    });
  }
  window.setInterval(refreshTimes, 5000);

  // "Select all" checkbox in a task table's header.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("table.tasks thead input[type=checkbox]")) return;
    box.closest("table").querySelectorAll("tbody input[type=checkbox][name=ids]").forEach(function (row) {
      row.checked = box.checked;
    });
  });
})();
