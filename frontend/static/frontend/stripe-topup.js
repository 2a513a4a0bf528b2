/* Wallet top-up with Stripe.js (frontend/stripe_views.py has the whole flow).
 *
 * The card is entered in Stripe's Card Element and goes to Stripe only:
 * confirmCardSetup(<setup secret>, {payment_method: {card}}). The server then charges
 * the top-up's PaymentIntent with it (POST pay_url); when Stripe asks for
 * authentication (3-D Secure), confirmCardPayment(<the PaymentIntent's client secret>)
 * completes it. Finally the browser goes to return_url, where the server asks Stripe
 * itself and credits the wallet only if Stripe says the payment succeeded.
 */
(function () {
  "use strict";
  const form = document.getElementById("card-form");
  if (!form || typeof Stripe === "undefined") { return; }
  const data = form.dataset;
  const stripe = Stripe(data.publishableKey);
  const card = stripe.elements().create("card");
  card.mount("#card-element");
  const errors = document.getElementById("card-errors");
  const button = document.getElementById("pay-button");
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;

  function fail(message) {
    errors.textContent = message;
    button.disabled = false;
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    errors.textContent = "";
    button.disabled = true;
    const setup = await stripe.confirmCardSetup(data.setupSecret,
                                                {payment_method: {card: card}});
    if (setup.error) {
      return fail(setup.error.message || "The card was not accepted.");
    }
    let answer;
    try {
      const response = await fetch(data.payUrl, {
        method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
        body: JSON.stringify({setup_intent: setup.setupIntent.id}),
      });
      answer = await response.json();
      if (!response.ok) {
        return fail(answer.error || "The payment was refused.");
      }
    } catch (err) {
      return fail("The server could not be reached; try again.");
    }
    if (answer.status === "requires_action") {
      const confirmed = await stripe.confirmCardPayment(data.paymentSecret);
      if (confirmed.error) {
        return fail(confirmed.error.message || "The card was not authenticated.");
      }
    }
    window.location.assign(data.returnUrl);  // the server asks Stripe, then credits
  });
})();
