// Threadmill console: the little behaviour htmx does not cover. No inline scripts anywhere,
// so the console's Content-Security-Policy (script-src 'self') holds.
(function () {
  "use strict";

  // Live pages: tell the server when the tab is hidden, so it stops pushing updates.
  var sockets = [];
  function sendVisibility(socket) {
    socket.send(JSON.stringify({ visible: !document.hidden }));
  }
  document.addEventListener("htmx:wsOpen", function (event) {
    var socket = event.detail.socketWrapper;
    sockets.push(socket);
    if (document.hidden) sendVisibility(socket);
  });
  document.addEventListener("htmx:wsClose", function (event) {
    sockets = sockets.filter(function (s) { return s !== event.detail.socketWrapper; });
  });
  document.addEventListener("visibilitychange", function () {
    sockets.forEach(sendVisibility);
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

  // "Select all" checkbox in a task table's header.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("table.tasks thead input[type=checkbox]")) return;
    box.closest("table").querySelectorAll("tbody input[type=checkbox][name=ids]").forEach(function (row) {
      row.checked = box.checked;
    });
  });
})();
