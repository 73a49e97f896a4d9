// The console's only script: toasts from HX-Trigger, and a guard that keeps the
// queue's poll from replacing rows while someone is typing or selecting in them.
(function () {
  "use strict";

  function showToast(message, level) {
    var box = document.getElementById("toasts");
    if (!box) return;
    var toast = document.createElement("div");
    toast.className = "toast toast-" + (level || "success");
    toast.textContent = message;
    box.appendChild(toast);
    setTimeout(function () { toast.remove(); }, 6000);
  }

  // The server answers htmx actions with HX-Trigger: {"toast": {"message", "level"}}.
  document.addEventListener("toast", function (event) {
    showToast(event.detail.message, event.detail.level);
  });

  // Server-rendered messages (the no-JavaScript flow) fade after a while too.
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("#toasts .toast").forEach(function (toast) {
      setTimeout(function () { toast.remove(); }, 8000);
    });
  });

  // True while a form in the queue is in use: an open "Reject…" panel, a checked
  // bulk box, or focus in a field. The poll skips its turn rather than wipe it.
  window.consoleQueueBusy = function () {
    var queue = document.getElementById("queue");
    if (!queue) return false;
    if (queue.querySelector("details[open]")) return true;
    if (document.querySelector("input[form=bulk]:checked")) return true;
    var active = document.activeElement;
    return !!(active && queue.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName));
  };

  // The queue polls every 5 s while the tab is visible and every 30 s while it is
  // hidden, and skips a turn while busy. Decided here rather than in an hx-trigger
  // filter, which htmx evaluates with Function(): the Content-Security-Policy
  // (script-src 'self', no 'unsafe-eval') forbids that.
  var lastQueuePoll = Date.now();
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    if (!elt || elt.id !== "queue" || event.detail.requestConfig.verb !== "get") return;
    var now = Date.now();
    if (window.consoleQueueBusy() || (document.hidden && now - lastQueuePoll < 30000)) {
      event.preventDefault();
      return;
    }
    lastQueuePoll = now;
  });
})();
