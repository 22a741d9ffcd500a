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

  // "Select all" checkbox in a task table's header.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("table.tasks thead input[type=checkbox]")) return;
    box.closest("table").querySelectorAll("tbody input[type=checkbox][name=ids]").forEach(function (row) {
      row.checked = box.checked;
    });
  });
})();
