/* The phone page's "Notify me": registers the service worker (/m/sw.js, scope /m/), subscribes this
 * browser to Web Push with the platform's VAPID key, and tells the platform (CSRF kept). Unticking
 * unsubscribes on both sides. Also the ntfy topic form. */
(function () {
  "use strict";
  var box = document.getElementById("n-notify");
  if (!box) return;
  var toggle = document.getElementById("n-toggle");
  var state = document.getElementById("n-state");
  var ntfyForm = document.getElementById("n-ntfy");
  var ntfyUrl = document.getElementById("n-ntfy-url");
  var ntfyState = document.getElementById("n-ntfy-state");
  var registration = null;

  function csrfToken() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function api(method, url, body) {
    var options = { method: method, credentials: "same-origin", headers: { "Accept": "application/json" } };
    if (method !== "GET") options.headers["X-CSRFToken"] = csrfToken();
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    return fetch(url, options).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) throw new Error(data.detail || ("HTTP " + response.status));
        return data;
      });
    });
  }

  function show(text, on) {
    state.textContent = text;
    toggle.checked = !!on;
    box.setAttribute("data-subscribed", on ? "true" : "false");
  }

  function keyBytes(base64url) {
    var padded = (base64url + "===".slice((base64url.length + 3) % 4)).replace(/-/g, "+").replace(/_/g, "/");
    var raw = atob(padded), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function refresh() {
    if (!registration) return Promise.resolve();
    return registration.pushManager.getSubscription().then(function (sub) {
      show(sub ? "on" : "off", !!sub);
      toggle.disabled = false;
    });
  }

  function subscribe() {
    show("asking…", true);
    return Notification.requestPermission().then(function (permission) {
      if (permission !== "granted") throw new Error("notifications are blocked for this site");
      return api("GET", "/api/notify/vapid-public-key");
    }).then(function (key) {
      if (!key.enabled) throw new Error("push is off on this platform");
      return registration.pushManager.getSubscription().then(function (existing) {
        return existing || registration.pushManager.subscribe({
          userVisibleOnly: true, applicationServerKey: keyBytes(key.public_key),
        });
      });
    }).then(function (sub) {
      return api("POST", "/api/notify/subscriptions", sub.toJSON());
    }).then(function () { show("on", true); });
  }

  function unsubscribe() {
    show("turning off…", false);
    return registration.pushManager.getSubscription().then(function (sub) {
      if (!sub) return null;
      return api("DELETE", "/api/notify/subscriptions", { endpoint: sub.endpoint })
        .catch(function () { return null; })  // already forgotten by the platform: still unsubscribe here
        .then(function () { return sub.unsubscribe(); });
    }).then(function () { show("off", false); });
  }

  toggle.addEventListener("change", function () {
    toggle.disabled = true;
    var work = toggle.checked ? subscribe() : unsubscribe();
    work.catch(function (error) {
      state.textContent = "not on: " + error.message;
      return refresh();
    }).then(function () { toggle.disabled = false; });
  });

  // --- ntfy ------------------------------------------------------------------------------------
  function showNtfy(data) {
    ntfyUrl.value = data.url || "";
    ntfyState.textContent = data.url ? "Notices also go to this topic." : "";
  }
  api("GET", "/api/notify/ntfy").then(showNtfy).catch(function () {});
  ntfyForm.addEventListener("submit", function (event) {
    event.preventDefault();
    api("PUT", "/api/notify/ntfy", { url: ntfyUrl.value.trim() }).then(showNtfy).catch(function (error) {
      ntfyState.textContent = "Not saved: " + error.message;
    });
  });
  document.getElementById("n-ntfy-clear").addEventListener("click", function () {
    api("DELETE", "/api/notify/ntfy").then(function () { showNtfy({}); });
  });

  // --- the service worker ------------------------------------------------------------------------
  if (!("serviceWorker" in navigator) || !("PushManager" in window) || !("Notification" in window)) {
    show("this browser cannot receive notices", false);
    return;
  }
  navigator.serviceWorker.register("/m/sw.js", { scope: "/m/" }).then(function (reg) {
    registration = reg;
    return api("GET", "/api/notify/vapid-public-key");
  }).then(function (key) {
    if (!key.enabled) {
      show("push is off on this platform", false);
      return null;
    }
    return refresh();
  }).catch(function (error) {
    show("unavailable: " + error.message, false);
  });
})();
