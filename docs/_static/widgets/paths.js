// Where RequireJS finds the modules the widgets' pages need: beside this file, in the
// site's own _static/widgets/ (docs/_ext/widget_assets.py puts them there), never on a
// CDN, so that the tutorials' widgets draw without a network.
(function () {
  var here = new URL(".", document.currentScript.src).href;
  window.requirejs.config({
    paths: {
      // anywidget's front end: tinax's tables and run timeline are anywidget views.
      anywidget: here + "anywidget",
      // The modules embed-amd.js defines itself. The HTML manager's stylesheet finds
      // its icon fonts beside the address RequireJS gives a module, so that address
      // must be this folder too.
      "@jupyter-widgets": here.replace(/\/$/, ""),
      "@jupyter-widgets/html-manager/dist/libembed-amd": here + "libembed-amd",
    },
  });
})();
