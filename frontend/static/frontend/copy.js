/* Copy buttons: <button data-copy="#id"> copies the value (or text) of the element #id with
 * navigator.clipboard (selecting it where the clipboard API is refused, e.g. plain http
 * off localhost) and says so in its data-copy-status element, for screen readers too. */
(function () {
  "use strict";
  function say(button, text) {
    var out = document.querySelector(button.dataset.copyStatus || "");
    if (out) out.textContent = text;
  }
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.hidden = false;
    button.addEventListener("click", function () {
      var source = document.querySelector(button.dataset.copy);
      if (!source) return;
      var text = source.value !== undefined ? source.value : source.textContent;
      function selectIt() {
        if (source.select) source.select();
        say(button, "Selected: press Ctrl+C (⌘C) to copy.");
      }
      if (!navigator.clipboard || !window.isSecureContext) { selectIt(); return; }
      navigator.clipboard.writeText(text).then(function () {
        say(button, "Copied to the clipboard.");
      }, selectIt);
    });
  });
})();
