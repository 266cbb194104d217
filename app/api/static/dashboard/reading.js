// What a realized privacy loss L means for an observer, in numbers and words.
//
// For every statement f about the object's value and every prior belief, the outputs released
// so far change the belief by at most a factor e^L (paper, section 3: e^-L <= Q(f|y)/Q(f) <= e^L),
// and the odds Q(f)/(1-Q(f)) by at most the same factor, because every value's likelihood lies
// within a factor e^L of every other's. A belief p therefore becomes at most
// p e^L / (p e^L + 1 - p). Over all priors the largest rise in the probability of a correct
// guess (the guessing advantage of Pankova and Laud) is tanh(L/4), reached at p = 1/(1+e^(L/2)).
import { num } from "./format.js";

export function oddsFactor(loss) {
  return Math.exp(loss);
}

// The most an observer who believed a statement with probability p can believe it after.
export function maxPosterior(p, loss) {
  const scaled = p * Math.exp(loss);
  return scaled / (scaled + 1 - p);
}

// The least: the odds are divided by at most e^L.
export function minPosterior(p, loss) {
  return p / (p + (1 - p) * Math.exp(loss));
}

// The largest possible rise of a belief, over all priors: tanh(L/4).
export function maxAdvantage(loss) {
  return Math.tanh(loss / 4);
}

// The prior at which that largest rise happens.
export function worstPrior(loss) {
  return 1 / (1 + Math.exp(loss / 2));
}

function fmt(value) {
  return num(Number(value));
}

function paragraph(parent, parts) {
  const p = document.createElement("p");
  for (const part of parts) {
    if (typeof part === "string") {
      p.append(part);
    } else {
      const strong = document.createElement("strong");
      strong.textContent = part.strong;
      if (part.id) {
        strong.id = part.id;
      }
      p.append(strong);
    }
  }
  parent.append(p);
  return p;
}

// Fill `section` with the reading of `loss` (the certified upper bound) for an object with
// `budget`; `accepted` outputs were released. `prior` is the p of the interactive example.
export function renderReading(section, { loss, lower, budget, accepted, prior }) {
  section.replaceChildren();
  const title = document.createElement("h3");
  title.textContent = `What a realized loss of ${fmt(loss)} means`;
  section.append(title);
  if (accepted === 0) {
    paragraph(section, ["No output has been released: an observer has learned nothing about this object yet."]);
  }
  paragraph(section, [
    `Whatever an observer believed about this object's value before — any statement about it, any prior — the ${accepted} output(s) released so far can multiply the odds of that statement by at most `,
    { strong: `e^${fmt(loss)} = ${fmt(oddsFactor(loss))}`, id: "reading-factor" },
    " (or divide them by at most as much). This holds whatever the true value is; it depends only on the released outputs.",
  ]);
  paragraph(section, [
    "Example: a statement the observer found as likely as not (p = 0.5) can now be believed with probability at most ",
    { strong: fmt(maxPosterior(0.5, loss)), id: "reading-half" },
    ` = e^L/(1+e^L), and at least ${fmt(minPosterior(0.5, loss))}.`,
  ]);

  const tryIt = document.createElement("p");
  const label = document.createElement("label");
  label.htmlFor = "prior";
  label.textContent = "Try a prior p = ";
  const input = document.createElement("input");
  input.id = "prior";
  input.type = "number";
  input.min = "0";
  input.max = "1";
  input.step = "0.01";
  input.value = String(prior);
  const out = document.createElement("output");
  out.id = "prior-result";
  out.htmlFor = "prior";
  const update = () => {
    const p = Number(input.value);
    if (!(p >= 0 && p <= 1)) {
      out.textContent = " — enter a probability between 0 and 1";
      return;
    }
    out.textContent = ` → after: at most ${fmt(maxPosterior(p, loss))}, at least ${fmt(minPosterior(p, loss))}`;
  };
  input.addEventListener("input", update);
  update();
  tryIt.append(label, input, out);
  section.append(tryIt);

  paragraph(section, [
    "Guessing advantage: over all priors, the probability of guessing a statement correctly rises by at most ",
    { strong: fmt(maxAdvantage(loss)), id: "reading-advantage" },
    ` (= tanh(L/4), for an observer who started at p = ${fmt(worstPrior(loss))}).`,
  ]);
  paragraph(section, [
    `At the budget ε_g = ${fmt(budget)} the filter stops: odds can never be multiplied by more than e^${fmt(budget)} = ${fmt(oddsFactor(budget))}, `,
    `and an even-odds belief can never exceed ${fmt(maxPosterior(0.5, budget))}.`,
  ]);
  if (loss - lower > 1e-6 * Math.max(1, loss)) {
    paragraph(section, [
      `The exact loss is not computed for this object: it lies between ${fmt(lower, 4)} and ${fmt(loss, 4)}. This reading uses the upper bound, so it never understates what was revealed.`,
    ]);
  }
  return input;
}
