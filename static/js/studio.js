// Studio: pick a probe, follow its room, issue commands, approve or skip what waits.
// Live over the room WebSocket (/ws/rooms/<id>); polling keeps it right when the socket is down.
(function () {
  "use strict";

  const root = document.getElementById("studio");
  if (!root) return;
  const picker = document.getElementById("probe-picker");
  const els = {
    info: document.getElementById("probe-info"),
    conversation: document.getElementById("conversation"),
    commands: document.getElementById("commands"),
    approvals: document.getElementById("approvals"),
    form: document.getElementById("command-form"),
    op: document.getElementById("op"),
    args: document.getElementById("args"),
    status: document.getElementById("form-status"),
  };
  const POLL_MS = 2500;
  const state = { probe: null, roomId: null, after: 0, socket: null, pollTimer: null, busy: false, again: false };

  // --- HTTP -------------------------------------------------------------------------------------
  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  async function api(url, options) {
    const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    opts.headers = Object.assign({ Accept: "application/json" }, opts.headers);
    if (opts.body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.headers["X-CSRFToken"] = csrfToken();
      opts.body = JSON.stringify(opts.body);
    }
    const response = await fetch(url, opts);
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const err = new Error((data && (data.detail || data.error)) || response.statusText);
      err.status = response.status;
      err.data = data;
      throw err;
    }
    return data;
  }

  const probeUrl = (id) => root.dataset.probesUrl + encodeURIComponent(id);
  const commandUrl = (id) => root.dataset.probesUrl + "commands/" + encodeURIComponent(id);

  // --- rendering helpers ------------------------------------------------------------------------
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of [].concat(children || [])) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function pretty(value) {
    return el("pre", { text: typeof value === "string" ? value : JSON.stringify(value, null, 2) });
  }

  function diffBlock(text) {
    const pre = el("pre", { class: "diff", "data-testid": "diff" });
    for (const line of String(text).split("\n")) {
      let cls = "";
      if (line.startsWith("+++") || line.startsWith("---")) cls = "file";
      else if (line.startsWith("+")) cls = "add";
      else if (line.startsWith("-")) cls = "del";
      else if (line.startsWith("@@")) cls = "hunk";
      pre.appendChild(el("span", { class: cls, text: line + "\n" }));
    }
    return pre;
  }

  function codeBlock(lines, firstLine) {
    const pre = el("pre", { class: "code", "data-testid": "code" });
    lines.forEach((line, i) => {
      let number = firstLine + i;
      let text = line;
      if (Array.isArray(line)) { number = line[0]; text = line[1]; }  // the probe's [n, text] pairs
      else if (line && typeof line === "object") { number = line.n || line.line || number; text = line.text || ""; }
      text = String(text);
      pre.appendChild(el("span", { class: "ln", text: String(number) }));
      pre.appendChild(document.createTextNode(text.replace(/\n$/, "") + "\n"));
    });
    return pre;
  }

  function renderRead(result, args) {
    const first = result.offset || args.offset || 1;  // 1-based line of the page's first line
    let lines = null;
    if (Array.isArray(result.lines)) lines = result.lines;
    else if (typeof result.content === "string" && result.encoding !== "base64") lines = result.content.split("\n");
    else if (typeof result.text === "string") lines = result.text.split("\n");
    if (lines && lines.length && lines[lines.length - 1] === "") lines = lines.slice(0, -1);
    const parts = [];
    if (lines) parts.push(codeBlock(lines, first));
    else parts.push(pretty(result));
    const more = [];
    if (result.total_lines !== undefined) more.push(result.total_lines + " lines in all");
    if (result.truncated || result.has_more || result.next_offset !== undefined && result.next_offset !== null) {
      more.push("more follows" + (result.next_offset !== undefined && result.next_offset !== null ? " from offset " + result.next_offset : ""));
    }
    if (more.length) parts.push(el("p", { class: "muted", text: more.join(" · ") }));
    return parts;
  }

  function renderTree(result) {
    const entries = result.entries || result.tree || result.items;
    if (!Array.isArray(entries)) return [pretty(result)];
    const text = entries.map((entry) => {
      if (typeof entry === "string") return entry;
      const path = entry.path || entry.name || "";
      const depth = entry.depth !== undefined ? entry.depth : Math.max(0, path.split("/").length - 1);
      const type = entry.type || entry.kind || "";
      let suffix = type === "dir" || type === "directory" ? "/" : "";
      if (type === "symlink" || type === "link" || entry.target || entry.link) suffix = " -> " + (entry.target || entry.link || "?");
      if (entry.broken) suffix += " (broken)";
      return "  ".repeat(depth) + (entry.name || path.split("/").pop() || path) + suffix;
    }).join("\n");
    const parts = [el("pre", { class: "tree", "data-testid": "tree", text: text })];
    if (result.truncated) parts.push(el("p", { class: "muted", text: "entry cap reached" }));
    return parts;
  }

  function renderGrep(result) {
    const hits = result.matches || result.hits || result.results;
    if (!Array.isArray(hits)) return [pretty(result)];
    const list = el("pre", { class: "hits", "data-testid": "hits" });
    for (const hit of hits) {
      const line = hit.line !== undefined ? hit.line : (hit.line_number !== undefined ? hit.line_number : hit.lineno);
      list.appendChild(el("span", { class: "path", text: (hit.path || hit.file || "") + ":" + (line !== undefined ? line : "") }));
      list.appendChild(document.createTextNode(": " + String(hit.text !== undefined ? hit.text : (hit.line_text || "")).replace(/\n$/, "") + "\n"));
    }
    const parts = [list, el("p", { class: "muted", text: hits.length + " hit" + (hits.length === 1 ? "" : "s") + (result.truncated ? " (capped)" : "") })];
    return parts;
  }

  function renderRun(result) {
    const parts = [];
    const code = result.exit_code !== undefined ? result.exit_code : result.returncode;
    if (code !== undefined) parts.push(el("p", { class: code === 0 ? "ok" : "bad", text: "exit " + code + (result.timed_out ? " (timed out)" : "") }));
    if (result.handle) parts.push(el("p", { text: "handle " + result.handle }));
    for (const stream of ["stdout", "stderr", "output"]) {
      if (typeof result[stream] === "string" && result[stream]) parts.push(el("pre", { text: result[stream] }));
    }
    return parts.length ? parts : [pretty(result)];
  }

  function renderResult(command) {
    const result = command.result;
    if (result === null || result === undefined) return [];
    if (typeof result !== "object") return [pretty(result)];
    switch (command.op) {
      case "read": return renderRead(result, command.args || {});
      case "read_tree": return renderTree(result);
      case "grep": return renderGrep(result);
      case "git_diff": return typeof result.diff === "string" ? [diffBlock(result.diff)] : [pretty(result)];
      case "run": case "run_background": case "run_output": case "stop": return renderRun(result);
      default: return [pretty(result)];
    }
  }

  function target(command) {
    const args = command.args || {};
    if (args.argv) return args.argv.join(" ") + (args.cwd ? "  (in " + args.cwd + ")" : "");
    return args.path || args.pattern || args.handle || "";
  }

  function renderCommand(command, withButtons) {
    const box = el("div", { class: "cmd " + command.state, "data-command-id": command.id, "data-state": command.state }, [
      el("div", { class: "head" }, [
        el("span", { class: "op", text: command.op }),
        el("code", { text: target(command) }),
        el("span", { class: "badge", "data-testid": "state", text: command.state.replace(/_/g, " ") }),
        withButtons ? el("span", { class: "muted", text: "on " + command.probe.name }) : null,
      ]),
    ]);
    if (command.state === "awaiting_approval") {
      if (command.op === "write") {
        const preview = command.preview || (command.args && command.args.diff);
        box.appendChild(preview ? diffBlock(preview) : el("p", { class: "muted", text: "Preparing the diff preview…" }));
      } else if (command.args && command.args.argv) {
        box.appendChild(pretty({ argv: command.args.argv, cwd: command.args.cwd, timeout: command.args.timeout }));
      } else {
        box.appendChild(pretty(command.args));
      }
      if (withButtons) {
        box.appendChild(el("div", { class: "row" }, [
          el("button", { class: "primary", type: "button", "data-testid": "approve", "data-id": command.id, "data-hash": command.args_hash, text: "Approve", onclick: onApprove }),
          el("button", { type: "button", "data-testid": "skip", "data-id": command.id, text: "Skip", onclick: onSkip }),
        ]));
      } else {
        box.appendChild(el("p", { class: "muted", text: "Waiting for your approval (above)." }));
      }
    }
    if (command.error) box.appendChild(el("p", { class: "bad", "data-testid": "error", text: command.error.code + ": " + command.error.detail }));
    for (const part of renderResult(command)) box.appendChild(part);
    return box;
  }

  // --- actions ----------------------------------------------------------------------------------
  async function decide(button, verb) {
    button.disabled = true;
    try {
      const body = verb === "approve" ? { args_hash: button.dataset.hash } : {};
      await api(commandUrl(button.dataset.id) + "/" + verb, { method: "POST", body: body });
    } catch (err) {
      alert(err.message);
    }
    await refresh();
  }
  function onApprove(event) { decide(event.currentTarget, "approve"); }
  function onSkip(event) { decide(event.currentTarget, "reject"); }

  const EXAMPLES = {
    read: { path: "", offset: 1, limit: 200 }, read_tree: { path: "", depth: 2 }, grep: { pattern: "", glob: "*.py" },
    stat: { path: "" }, ast_parse: { path: "" }, git_diff: { path: "" }, git_log: { path: "", limit: 20 },
    ping: {}, info: {}, write: { path: "", content: "" }, run: { argv: [], cwd: "", timeout: 60 },
    run_background: { argv: [], cwd: "" }, run_output: { handle: "" }, stop: { handle: "" },
  };
  els.op.addEventListener("change", () => {
    els.args.value = JSON.stringify(EXAMPLES[els.op.value] || {});
  });

  els.form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!state.probe) { els.status.textContent = "Pick a probe first."; return; }
    let args;
    try { args = JSON.parse(els.args.value || "{}"); } catch (e) { els.status.textContent = "The arguments are not valid JSON."; return; }
    els.status.textContent = "Sending…";
    try {
      const command = await api(probeUrl(state.probe) + "/commands", { method: "POST", body: { op: els.op.value, args: args, wait: 5 } });
      els.status.textContent = command.state.replace(/_/g, " ");
    } catch (err) {
      els.status.textContent = err.message;
    }
    await refresh();
  });

  // --- loading ----------------------------------------------------------------------------------
  async function loadApprovals() {
    const pending = await api(root.dataset.approvalsUrl);
    els.approvals.replaceChildren();
    if (!pending.length) els.approvals.appendChild(el("p", { class: "muted", text: "Nothing waits for you." }));
    for (const command of pending) els.approvals.appendChild(renderCommand(command, true));
  }

  async function loadCommands() {
    if (!state.probe) return;
    const commands = await api(probeUrl(state.probe) + "/commands");
    els.commands.replaceChildren();
    if (!commands.length) els.commands.appendChild(el("p", { class: "muted", text: "No commands yet." }));
    for (const command of commands.slice().reverse()) els.commands.appendChild(renderCommand(command, false));
  }

  function renderMessage(message) {
    const body = message.body || {};
    const who = message.author_device ? "probe" : (message.author_user ? "you" : "");
    const text = body.text !== undefined ? String(body.text) : JSON.stringify(body);
    const [first, ...rest] = text.split("\n");
    return el("div", { class: "msg", "data-seq": message.seq }, [
      el("span", { class: "who", text: typeof who === "string" ? who : "" }),
      el("span", { text: first }),
      rest.length ? el("pre", { text: rest.join("\n") }) : null,
    ]);
  }

  async function loadMessages() {
    if (!state.roomId) return;
    let data;
    try {
      data = await api("/api/im/rooms/" + encodeURIComponent(state.roomId) + "/messages?after=" + state.after + "&limit=200");
    } catch (err) {
      return;  // the room may be unavailable; commands still show
    }
    if (state.after === 0) els.conversation.replaceChildren();
    for (const message of data.messages || []) {
      els.conversation.appendChild(renderMessage(message));
      state.after = Math.max(state.after, message.seq || 0);
    }
    if (!els.conversation.children.length) els.conversation.appendChild(el("p", { class: "muted", text: "Nothing said yet." }));
    els.conversation.scrollTop = els.conversation.scrollHeight;
  }

  async function refresh() {
    if (state.busy) { state.again = true; return; }  // an event during a load: load once more after it
    state.busy = true;
    try {
      await Promise.all([loadApprovals(), loadCommands(), loadMessages()]);
    } catch (err) {
      if (err.status === 401 || err.status === 403) window.location.reload();
    } finally {
      state.busy = false;
      if (state.again) { state.again = false; refresh(); }
    }
  }

  function connectRoom() {
    if (state.socket) { state.socket.onclose = null; state.socket.close(); state.socket = null; }
    if (!state.roomId || !window.WebSocket) return;
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + "/ws/rooms/" + state.roomId);
    socket.onmessage = () => refresh();
    socket.onclose = () => { if (state.socket === socket) { state.socket = null; setTimeout(connectRoom, 5000); } };
    state.socket = socket;
  }

  async function selectProbe(id) {
    state.probe = id || null;
    state.roomId = null;
    state.after = 0;
    els.conversation.replaceChildren();
    els.commands.replaceChildren();
    if (!state.probe) return;
    try {
      const probe = await api(probeUrl(state.probe));
      state.roomId = probe.room_id;
      const modes = probe.modes.length ? probe.modes.join(", ") : "read-only";
      els.info.textContent = [probe.online ? "online" : "offline", probe.hostname,
        "roots: " + (probe.roots.join(", ") || "none"), modes].filter(Boolean).join(" · ");
    } catch (err) {
      els.info.textContent = err.message;
    }
    connectRoom();
    await refresh();
  }

  picker.addEventListener("change", () => selectProbe(picker.value));
  selectProbe(picker.value);
  state.pollTimer = setInterval(refresh, POLL_MS);
  if (!picker.value) refresh();
})();
