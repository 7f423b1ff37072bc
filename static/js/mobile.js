// The phone page: waiting questions by session, answered with a tap. Live over /ws/mobile; when the
// socket is down it polls /api/mobile/pending. No framework, no build step.
(function () {
  "use strict";

  var POLL_MS = 4000;
  var STATE_TEXT = {
    pending: "Waiting for your answer",
    answered: "Answered",
    answered_on_desktop: "Answered on the desktop",
    moved_to_desktop: "Moved to the desktop",
    expired: "Expired",
    cancelled: "The session ended"
  };
  // Refusal codes from POST /api/mobile/answer that name what became of the question.
  var REFUSAL_STATE = {
    already_answered: "answered",
    answered_on_desktop: "answered_on_desktop",
    moved_to_desktop: "moved_to_desktop",
    expired: "expired",
    session_ended: "cancelled"
  };

  var questions = {};   // question_id -> question (as /pending gives it) + local selection
  var sessions = {};    // session_id -> session
  var bridges = {};     // device_id -> bridge
  var cards = {};       // question_id -> DOM node
  var sessionCards = {};
  var socket = null;
  var pollTimer = null;
  var retryMs = 1000;
  var switchedOff = false;

  var $sessions = document.getElementById("m-sessions");
  var $empty = document.getElementById("m-empty");
  var $live = document.getElementById("m-live");
  var $bridges = document.getElementById("m-bridges");

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else if (key === "class") node.className = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }

  function csrfToken() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function api(method, url, body) {
    var options = { method: method, credentials: "same-origin", headers: { "Accept": "application/json" } };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.headers["X-CSRFToken"] = csrfToken();
      options.body = JSON.stringify(body);
    }
    return fetch(url, options).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        return { ok: response.ok, status: response.status, data: data };
      });
    }, function () {
      // No answer at all (the network dropped): callers show this and let the person try again.
      return { ok: false, status: 0, data: { detail: "No connection to the platform. Try again." } };
    });
  }

  // --- state -----------------------------------------------------------------------------------

  function upsertQuestion(q) {
    var known = questions[q.question_id];
    if (known) {
      known.state = q.state || known.state;
      if (q.nonce) known.nonce = q.nonce;
    } else {
      q.chosen = {};
      q.questions.forEach(function (item) { q.chosen[item.question] = []; });
      questions[q.question_id] = q;
    }
    if (!sessions[q.session_id]) sessions[q.session_id] = { session_id: q.session_id, title: "", state: "open" };
    render();
  }

  function setQuestionState(id, state) {
    if (!questions[id] || !state) return;
    questions[id].state = state;
    render();
  }

  function applyState(state) {
    bridges = {};
    (state.bridges || []).forEach(function (b) { bridges[b.device_id] = b; });
    (state.sessions || []).forEach(function (s) { sessions[s.session_id] = Object.assign(sessions[s.session_id] || {}, s); });
    if (state.mobile_reply === false) switchOff();
    render();
  }

  // `recent` is null for a socket snapshot: then a question that left the pending list is re-read by
  // one poll (which carries the recent states) instead of being guessed.
  function applyPending(list, recent) {
    var seen = {};
    list.forEach(function (q) { seen[q.question_id] = true; upsertQuestion(q); });
    var named = {};
    (recent || []).forEach(function (q) { named[q.question_id] = true; setQuestionState(q.question_id, q.state); });
    var missing = Object.keys(questions).filter(function (id) {
      return !seen[id] && !named[id] && questions[id].state === "pending";
    });
    if (!missing.length) return;
    if (recent === null) { poll(); return; }
    missing.forEach(function (id) { setQuestionState(id, "expired"); });
  }

  function switchOff() {
    switchedOff = true;
    document.getElementById("m-off").hidden = false;
    Object.keys(questions).forEach(function (id) {
      if (questions[id].state === "pending") questions[id].state = "moved_to_desktop";
    });
    stopPolling();
  }

  // --- rendering -------------------------------------------------------------------------------

  function render() {
    var ids = Object.keys(sessions);
    ids.sort(function (a, b) { return waiting(b) - waiting(a); });
    ids.forEach(function (sid, i) {
      var card = sessionCard(sessions[sid]);
      // Waiting sessions first. A card moves only when it is out of place: moving a node blurs the text
      // being typed in it and drops a tap between its press and its release.
      var here = $sessions.children[i] || null;
      if (here !== card) $sessions.insertBefore(card, here);
    });
    Object.keys(questions).forEach(function (id) { questionCard(questions[id]); });
    $empty.hidden = ids.length > 0;
    renderBridges();
  }

  function waiting(sid) {
    return Object.keys(questions).filter(function (id) {
      return questions[id].session_id === sid && questions[id].state === "pending";
    }).length;
  }

  function renderBridges() {
    $bridges.textContent = "";
    var list = Object.keys(bridges).map(function (k) { return bridges[k]; });
    if (!list.length) { $bridges.appendChild(el("span", { class: "muted", text: "No bridge paired yet." })); return; }
    list.forEach(function (b) {
      $bridges.appendChild(el("span", { "data-testid": "bridge", "data-device-id": b.device_id }, [
        document.createTextNode(b.name + " "),
        el("span", { class: "badge " + (b.online ? "online" : "offline"), text: b.online ? "online" : "offline" }),
        el("span", { class: "muted", "data-testid": "bridge-seen",
                     text: b.online || !b.last_seen_at ? "" : " last seen " + new Date(b.last_seen_at).toLocaleTimeString() })
      ]));
    });
  }

  function sessionCard(s) {
    var card = sessionCards[s.session_id];
    if (!card) {
      var keep = el("input", { type: "checkbox", "data-testid": "keep-going" });
      keep.addEventListener("change", function () {
        api("POST", "/api/mobile/sessions/" + encodeURIComponent(s.session_id) + "/keep_going", { enabled: keep.checked })
          .then(function (r) { if (!r.ok) { keep.checked = !keep.checked; note(card, r.data.detail || "Could not change it."); } });
      });
      var text = el("textarea", { "data-testid": "message-text", placeholder: "Message to this session", maxlength: "8000" });
      var send = el("button", { type: "button", "data-testid": "send-message", text: "Send message" });
      send.addEventListener("click", function () {
        var value = text.value.trim();
        if (!value) return;
        send.disabled = true;
        api("POST", "/api/mobile/sessions/" + encodeURIComponent(s.session_id) + "/messages", { text: value })
          .then(function (r) {
            send.disabled = false;
            if (r.ok) { text.value = ""; logLine(card, r.data.message_id, messageLine(Object.assign({ text: value }, r.data))); }
            else note(card, r.data.detail || "Not sent.");
          });
      });
      card = el("section", { class: "card m-session", "data-testid": "session", "data-session-id": s.session_id }, [
        el("h2", { class: "m-title" }),
        el("div", { class: "m-where muted" }),
        el("div", { class: "m-questions" }),
        el("div", { class: "m-compose" }, [
          text,
          el("div", { class: "row" }, [el("label", { class: "m-switch" }, [keep, document.createTextNode("Keep this session going")]), send]),
          el("p", { class: "m-note muted", "data-testid": "session-note" }),
          el("ul", { class: "m-log muted" })
        ])
      ]);
      sessionCards[s.session_id] = card;
    }
    card.querySelector(".m-title").textContent = s.title || "Agent session";
    var bridge = bridges[s.device_id];
    card.querySelector(".m-where").textContent = [s.host, s.cwd, bridge ? (bridge.online ? "bridge online" : "bridge offline") : ""]
      .filter(Boolean).join(" · ");
    card.querySelector("[data-testid=keep-going]").checked = !!s.keep_going;
    var ended = s.state === "ended";
    card.querySelector(".m-compose").hidden = ended;
    card.classList.toggle("m-ended", ended);
    (s.waiting_messages || []).forEach(function (w) {
      logLine(card, w.message_id, messageLine({ state: "waiting", text: w.text, position: w.position }));
    });
    return card;
  }

  function note(card, text) { card.querySelector(".m-note").textContent = text; }

  // Paced messages wait on the platform, in order: say so, with the place in line.
  function messageLine(m) {
    if (m.state === "consumed") return "Read by the agent: " + m.text;
    if (m.state === "waiting") {
      var when = m.release_at ? " (next one at " + new Date(m.release_at).toLocaleTimeString() + ")" : "";
      return "Waiting, " + (m.position || "?") + " in line" + when + ": " + m.text;
    }
    return "Sent: " + m.text;
  }

  function logLine(card, id, text) {
    var log = card.querySelector(".m-log");
    var line = log.querySelector('[data-message-id="' + id + '"]') || el("li", { "data-message-id": id });
    line.textContent = text;
    log.appendChild(line);
  }

  function questionCard(q) {
    var card = cards[q.question_id];
    if (!card) {
      card = buildQuestion(q);
      cards[q.question_id] = card;
      sessionCards[q.session_id].querySelector(".m-questions").appendChild(card);
    }
    var state = card.querySelector("[data-testid=question-state]");
    state.textContent = STATE_TEXT[q.state] || q.state;
    state.className = "m-state " + q.state;
    card.setAttribute("data-state", q.state);
    card.classList.toggle("m-closed", q.state !== "pending");
    card.querySelectorAll("[data-testid=option]").forEach(function (button) {
      var chosen = q.chosen[button.getAttribute("data-question")] || [];
      button.setAttribute("aria-pressed", chosen.indexOf(button.getAttribute("data-label")) >= 0 ? "true" : "false");
    });
  }

  function buildQuestion(q) {
    var card = el("article", { class: "m-question", "data-testid": "question", "data-question-id": q.question_id });
    if (q.kind === "permission") card.appendChild(permissionView(q));
    q.questions.forEach(function (item) {
      var options = el("div", { class: "m-options", role: item.multiSelect ? "group" : "radiogroup" });
      item.options.forEach(function (option) {
        var button = el("button", { type: "button", class: "m-option", "data-testid": "option", "data-label": option.label,
          "data-question": item.question, "aria-pressed": "false" }, [
          el("span", { class: "m-label", text: option.label }),
          option.description ? el("span", { class: "m-desc", text: option.description }) : null
        ]);
        button.addEventListener("click", function () { toggle(q, item, option.label); });
        options.appendChild(button);
      });
      var other = el("input", { type: "text", class: "m-other", "data-testid": "other", "data-question": item.question,
        placeholder: q.kind === "permission" ? "Reason for the agent if you deny (optional)" : "Other answer (optional)",
        maxlength: "8000" });
      card.appendChild(el("div", { class: "m-item" }, [
        el("span", { class: "badge m-header", text: item.header || "Question" }),
        item.multiSelect ? el("span", { class: "muted", text: " · choose any" }) : null,
        el("p", { class: "m-text", text: item.question }),
        options,
        other
      ]));
    });
    var submit = el("button", { type: "button", class: "primary", "data-testid": "submit-answer", text: "Send answer" });
    submit.addEventListener("click", function () { submitAnswer(q, card, submit); });
    card.appendChild(el("div", { class: "m-actions" }, [submit]));
    card.appendChild(el("p", { class: "m-state", "data-testid": "question-state" }));
    card.appendChild(el("p", { class: "m-error", "data-testid": "answer-error" }));
    return card;
  }

  // A tool asking to run: its name and what it would do (a command, a diff), as plain text only.
  function permissionView(q) {
    var r = q.rendering || {};
    var lines = (r.text || "").split("\n").map(function (line) {
      var kind = r.kind !== "diff" ? "" : line.charAt(0) === "+" ? "m-add" : line.charAt(0) === "-" ? "m-del" : "";
      return el("span", { class: "m-line " + kind, text: line + "\n" });
    });
    return el("div", { class: "m-permission", "data-testid": "permission" }, [
      el("span", { class: "badge", "data-testid": "tool-name", text: q.tool_name || "Tool" }),
      el("span", { class: "muted", text: r.kind === "diff" ? " wants to change a file" : " wants to run" }),
      el("pre", { class: "m-rendering", "data-testid": "rendering" }, lines),
      r.truncated ? el("p", { class: "muted", text: "Shortened; the full input is on the desktop." }) : null
    ]);
  }

  function toggle(q, item, label) {
    if (q.state !== "pending") return;
    var chosen = q.chosen[item.question];
    var at = chosen.indexOf(label);
    if (item.multiSelect) { if (at >= 0) chosen.splice(at, 1); else chosen.push(label); }
    else q.chosen[item.question] = at >= 0 ? [] : [label];
    questionCard(q);
  }

  function submitAnswer(q, card, submit) {
    var other = {};
    card.querySelectorAll("[data-testid=other]").forEach(function (input) {
      if (input.value.trim()) other[input.getAttribute("data-question")] = input.value.trim();
    });
    var error = card.querySelector("[data-testid=answer-error]");
    error.textContent = "";
    submit.disabled = true;
    var body = { question_id: q.question_id, nonce: q.nonce, answers: q.chosen, other: other };
    if (q.kind === "permission") body.input_hash = q.input_hash;  // the decision is for this very input
    api("POST", "/api/mobile/answer", body)
      .then(function (r) {
        submit.disabled = false;
        if (r.ok) { setQuestionState(q.question_id, r.data.state || "answered"); return; }
        var named = REFUSAL_STATE[r.data.error];
        if (named) setQuestionState(q.question_id, named);
        else error.textContent = r.data.detail || "The answer was not accepted.";
      });
  }

  // --- live updates, with polling while the socket is down -------------------------------------

  function onEvent(event) {
    switch (event.type) {
      case "mobile.snapshot":
        applyState(event.state || {});
        applyPending(event.questions || [], null);
        break;
      case "mobile.question.created": upsertQuestion(event.question); break;
      case "mobile.question.updated": setQuestionState(event.question_id, event.state); break;
      case "mobile.session.updated":
        sessions[event.session.session_id] = Object.assign(sessions[event.session.session_id] || {}, event.session);
        render();
        break;
      case "mobile.message.updated": {
        var card = sessionCards[event.message.session_id];
        if (card) logLine(card, event.message.message_id, messageLine(event.message));
        break;
      }
      case "mobile.switch.changed": if (!event.enabled) switchOff(); break;
      case "devices.presence.changed":
        if (bridges[event.device_id]) {
          bridges[event.device_id].online = event.online;
          bridges[event.device_id].last_seen_at = event.last_seen_at;
          render();
        }
        break;
    }
  }

  function poll() {
    return Promise.all([api("GET", "/api/mobile/pending?recent=1"), api("GET", "/api/mobile/state")]).then(function (rs) {
      if (rs[0].status === 404 || rs[1].status === 404) { switchOff(); render(); return; }
      if (rs[1].ok) applyState(rs[1].data);
      if (rs[0].ok) applyPending(rs[0].data.questions || [], rs[0].data.recent || []);
    });  // offline (status 0): nothing applied; the next tick tries again
  }

  function startPolling() {
    if (pollTimer || switchedOff) return;
    $live.textContent = "polling";
    $live.className = "badge offline";
    poll();
    pollTimer = setInterval(poll, POLL_MS);
  }

  function stopPolling() { if (pollTimer) { clearInterval(pollTimer); pollTimer = null; } }

  function connect() {
    if (switchedOff || !window.WebSocket) { startPolling(); return; }
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/mobile";
    try { socket = new WebSocket(url); } catch (e) { startPolling(); return; }
    socket.onopen = function () {
      retryMs = 1000;
      stopPolling();
      $live.textContent = "live";
      $live.className = "badge online";
    };
    socket.onmessage = function (message) {
      try { onEvent(JSON.parse(message.data)); } catch (e) { /* ignore a bad frame */ }
    };
    socket.onclose = function () {
      socket = null;
      startPolling();
      if (!switchedOff) setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  // A question whose time is up (by this clock) is re-read: the server names its state.
  setInterval(function () {
    var now = Date.now();
    var due = Object.keys(questions).some(function (id) {
      var q = questions[id];
      return q.state === "pending" && q.expires_at && Date.parse(q.expires_at) + 3000 < now;
    });
    if (due && !switchedOff) poll();
  }, 10000);

  window.ai1netMobile = { state: function () { return { questions: questions, sessions: sessions, bridges: bridges }; } };
  poll().then(connect);
})();
