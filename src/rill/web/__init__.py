"""The web page's files (index.html, style.css, JavaScript modules, icon.svg): plain files, no build
step, nothing fetched from the network. rill.transports.web serves them at / and /web/."""
