from mrv2_prof.cli import main_entry

main_entry()
