// The browser half of tinax's line of text with links (widgets/_links.py): a line of
// parts, some of them links; a click on a link (or Enter on it) sends its number back.
// Long paths wrap anywhere rather than widen the output.

function render({ model, el }) {
  const line = document.createElement("div");
  line.className = "tinax-links";
  line.style.cssText = "overflow-wrap:anywhere;line-height:1.5;font-size:var(--jp-content-font-size1,13px)";
  el.append(line);
  const draw = () => {
    line.replaceChildren();
    for (const part of model.get("parts") || []) {
      let node;
      if (Number.isInteger(part.link)) {
        node = document.createElement("a");
        node.href = "#";
        node.className = "tinax-link";
        node.style.cssText = "color:var(--jp-content-link-color,#1a6fb3);text-decoration:underline;cursor:pointer";
        node.addEventListener("click", (event) => {
          event.preventDefault();
          model.send({ link: part.link });
        });
      } else {
        node = document.createElement("span");
      }
      if (part.color) node.style.color = part.color;
      if (part.code) node.style.fontFamily = "var(--jp-code-font-family, monospace)";
      if (part.title) node.title = part.title;
      if (part.css) node.classList.add(part.css);
      node.textContent = part.text;
      line.append(node);
    }
  };
  model.on("change:parts", draw);
  draw();
}

export default { render };
