// airflow-finalckpt pipeline page: refreshes the live part every 2 s and sends stop/resume
// requests after a confirmation dialog. No framework, no build step.
// The page runs inside Airflow's sandboxed iframe (no allow-modals), so the confirmation is a
// <dialog> element, not window.confirm().
(function () {
  "use strict";
  var live = document.getElementById("live");
  var message = document.getElementById("message");
  var dialog = document.getElementById("confirm");
  var endpoints = document.getElementById("endpoints");
  if (!live) return;
  var refreshMs = parseInt(live.getAttribute("data-refresh-ms") || "2000", 10);
  var busy = false;
  var timer = null;
  // state of the run when a change was sent: its "requested" message stays until the run
  // leaves that state and the transitional stopping/draining ones.
  var pendingFrom = null;

  function runState() {
    var el = live.querySelector("[data-run-state]");
    return el ? el.getAttribute("data-run-state") : null;
  }

  function show(text, kind) {
    if (!message) return;
    message.textContent = text;
    message.className = kind || "error";
    message.hidden = !text;
  }

  function detailOf(response, body) {
    try {
      var data = JSON.parse(body);
      if (data && data.detail) return String(data.detail);
    } catch (e) { /* not JSON: an HTML error page */ }
    var doc = new DOMParser().parseFromString(body, "text/html");
    var p = doc.querySelector(".error p");
    return (p && p.textContent) || ("HTTP " + response.status);
  }

  function refresh() {
    if (busy) return schedule();
    var url = live.getAttribute("data-live-url");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        return response.text().then(function (body) {
          if (response.ok) {
            live.innerHTML = body;
            if (message && message.className === "stale") show("");
            var now = runState();
            if (pendingFrom !== null && now !== pendingFrom &&
                now !== "stopping" && now !== "draining") {
              pendingFrom = null;
              if (message && message.className === "info") show("");
            }
          } else if (response.status === 401) {
            show("Your Airflow session has expired: log in again.", "error");
          } else if (response.status === 404) {
            live.innerHTML = '<div class="error" role="alert"><p></p></div>';
            live.querySelector("p").textContent = detailOf(response, body);
          } else {
            show(detailOf(response, body), "error");
          }
        });
      })
      .catch(function (err) { show("Cannot reach the Airflow API server: " + err, "stale"); })
      .then(schedule, schedule);
  }

  function schedule() {
    if (timer) clearTimeout(timer);
    timer = setTimeout(refresh, refreshMs);
  }

  var texts = {
    drain: "Stop with drain: sources stop reading new input, every event-time window fires, " +
      "all stages finish and commit, and the DAG run ends. Unread input is left unread. " +
      "A drained run cannot be resumed.",
    savepoint: "Stop with savepoint: running stages stop at their next split batch without " +
      "finishing, a savepoint is written and Spark is released. Resume later with nothing " +
      "lost and nothing duplicated.",
    resume: "Resume: the suspended run continues from its savepoint in this DAG run.",
    reset: "Recompute: forget the progress of stage %s and of every stage downstream of it. " +
      "Then clear their tasks in Airflow: they run again from scratch. Sinks that declare a " +
      "slice replace it; the others append the recomputed rows."
  };

  function confirmThen(title, text, action) {
    if (!dialog || typeof dialog.showModal !== "function") {
      // No <dialog> support: refuse rather than act without a confirmation.
      show("This browser cannot show the confirmation dialog.", "error");
      return;
    }
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    dialog.returnValue = "";
    dialog.onclose = function () {
      if (dialog.returnValue === "ok") action();
    };
    dialog.showModal();
  }

  function post(path, body, doneText) {
    busy = true;
    pendingFrom = runState();
    show("Sending…", "info");
    var api = endpoints.getAttribute("data-api");
    fetch(api + path, {
      method: "POST",
      credentials: "same-origin",
      headers: {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "X-Finalckpt-Request": "1"
      },
      body: JSON.stringify(body || {})
    })
      .then(function (response) {
        return response.text().then(function (text) {
          if (response.ok) {
            show(doneText, "info");
          } else {
            pendingFrom = null;
            show(detailOf(response, text) + " (HTTP " + response.status + ")", "error");
          }
        });
      })
      .catch(function (err) { show("Request failed: " + err, "error"); })
      .then(function () { busy = false; refresh(); });
  }

  live.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action]");
    if (!button || button.disabled || !endpoints) return;
    var action = button.getAttribute("data-action");
    var mode = button.getAttribute("data-mode");
    var label = button.getAttribute("data-label");
    if (action === "stop") {
      confirmThen(label + "?", texts[mode], function () {
        post("/stop", { mode: mode }, label + " requested: waiting for the savepoint…");
      });
    } else if (action === "resume") {
      confirmThen("Resume?", texts.resume, function () {
        post("/resume", {}, "Resume requested.");
      });
    } else if (action === "reset") {
      var stage = button.getAttribute("data-stage");
      confirmThen(label + "?", texts.reset.replace("%s", stage), function () {
        post("/reset", { stage_id: stage }, "Stage " + stage + " reset: clear its task and " +
          "the tasks downstream of it in Airflow to recompute them.");
      });
    }
  });

  schedule();
})();
