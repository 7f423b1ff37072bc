/* ai1net service worker, served at /m/sw.js (scope /m/).
 * A push says only that an agent is waiting, and how many questions: the notice shows that and
 * nothing else. Tapping it opens /m/ (always /m/: never an address taken from a push). */
"use strict";

var PHONE = "/m/";

self.addEventListener("install", function () { self.skipWaiting(); });
self.addEventListener("activate", function (event) { event.waitUntil(self.clients.claim()); });

self.addEventListener("push", function (event) {
  var data = {};
  try { data = event.data ? event.data.json() : {}; } catch (e) { data = {}; }
  var count = typeof data.count === "number" && data.count > 0 ? Math.floor(data.count) : 0;
  var body = count ? "An agent is waiting (" + count + ")" : "An agent is waiting";
  event.waitUntil(self.registration.showNotification("ai1net", {
    body: body, tag: "ai1net-waiting", renotify: true, data: { url: PHONE },
  }));
});

self.addEventListener("notificationclick", function (event) {
  event.notification.close();
  var target = new URL(PHONE, self.location.origin).href;
  event.waitUntil(self.clients.matchAll({ type: "window", includeUncontrolled: true }).then(function (windows) {
    for (var i = 0; i < windows.length; i++) {
      if (windows[i].url.indexOf(target) === 0 && "focus" in windows[i]) return windows[i].focus();
    }
    return self.clients.openWindow(PHONE);
  }));
});
