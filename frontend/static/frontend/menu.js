/* The small-screen menu: the header's "Menu" button opens and closes the links
 * (app.css shows them inline on wide screens; without this script they stay open). */
(function () {
  "use strict";
  var button = document.getElementById("menu-toggle");
  var header = button && button.closest("header");
  if (!header) return;
  header.classList.add("menu-ready");
  button.addEventListener("click", function () {
    var open = header.classList.toggle("menu-open");
    button.setAttribute("aria-expanded", open ? "true" : "false");
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape" && header.classList.contains("menu-open")) {
      header.classList.remove("menu-open");
      button.setAttribute("aria-expanded", "false");
      button.focus();
    }
  });
})();
