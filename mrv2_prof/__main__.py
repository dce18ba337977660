from mrv2_prof.cli import app

app(prog_name="mrv2-prof")
